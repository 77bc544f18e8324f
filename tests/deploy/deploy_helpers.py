"""Helpers for the deployment tests: the renderer, tree names, ``--help`` text, object lookup.

The renderer is ``scripts/render.py`` (not a package), loaded by path once per session.
Rendering is pure and offline, so each tree is rendered once and shared read-only.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
TREES = ("deploy", *sorted(f"deploy/overlays/{p.name}" for p in (DEPLOY / "overlays").iterdir()))
K8S_VERSION = "1.31.0"


def _load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpustack_deploy_render", REPO / "scripts/render.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render = _load_renderer()


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

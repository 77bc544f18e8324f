"""The node agents are one source for both installs: what ``kubectl kustomize deploy/base`` builds
and what the worker renders as the ``device-manager`` and ``model-manager`` applications (with
``deploy/overlays/applications``) are the same objects; and that overlay leaves exactly those
objects to the worker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import REPO, find, kustomized, pod_spec

from controlplane.applications import agents

APPLICATIONS = "deploy/overlays/applications"


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _rendered(image: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {_key(o): o for app in agents.FILES for o in agents.render(app, image=image)}


def _base_image(base: list[dict[str, Any]]) -> str:
    worker = find(base, "Deployment", "gpustack-operator-worker")
    return str(pod_spec(worker)["containers"][0]["image"])


def test_the_packaged_files_are_links_to_the_base() -> None:
    bundled = REPO / "controlplane" / "applications" / "bundled"
    files = {p.name for p in bundled.iterdir()}
    assert files == {f for fs in agents.FILES.values() for f in fs}
    for name in files:
        link = bundled / name
        assert link.is_symlink(), name
        assert Path(os.path.realpath(link)) == REPO / "deploy" / "base" / name


def test_the_worker_renders_what_kustomize_builds_for_the_agents(
    base: list[dict[str, Any]],
) -> None:
    image = _base_image(base)  # the worker's own image: gpustack/gpustack-operator:<tag>
    rendered = _rendered(image)
    components = {"device-manager", "model-manager"}
    built = {
        _key(o): o
        for o in base
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") in components
    }
    assert len(built) == 15
    assert rendered == built


def test_only_the_operator_image_is_replaced(base: list[dict[str, Any]]) -> None:
    rendered = _rendered("registry.example/op:1")
    images = {
        c["name"]: c["image"]
        for o in rendered.values()
        if o["kind"] == "DaemonSet"
        for c in pod_spec(o)["containers"]
    }
    assert images["device-manager"] == images["model-manager"] == "registry.example/op:1"
    assert images["node-driver-registrar"].startswith("registry.k8s.io/sig-storage/")


@pytest.mark.parametrize("kept", [("nvidia",), ("amd", "ascend")])
def test_manufacturer_leaves_out_the_other_agents(kept: tuple[str, ...]) -> None:
    objs = [o for app in agents.FILES for o in agents.render(app, image="x", manufacturers=kept)]
    agent_sets = {
        o["metadata"]["labels"][agents.MANUFACTURER]
        for o in objs
        if o["kind"] == "DaemonSet" and agents.MANUFACTURER in o["metadata"]["labels"]
    }
    assert agent_sets == set(kept)
    assert find(objs, "DaemonSet", "gpustack-operator-model-manager")


def test_the_applications_overlay_leaves_exactly_the_agents_to_the_worker(
    base: list[dict[str, Any]],
) -> None:
    overlay = {_key(o) for o in kustomized(APPLICATIONS)}
    base_keys = {_key(o) for o in base}
    assert base_keys - overlay == set(_rendered("x"))

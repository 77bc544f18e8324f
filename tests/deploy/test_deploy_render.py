"""The renderer: deterministic output, the kustomize subset it implements, what overlays change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import REPO, TREES, find, pod_spec, render


@pytest.mark.parametrize("tree", TREES)
def test_rendering_twice_is_byte_identical(tree: str) -> None:
    first = render.render(REPO / tree)
    assert first == render.render(REPO / tree)
    assert first.startswith("---\n")


def test_the_command_line_prints_the_same_text() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/render.py", "deploy"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
        check=True,
    )
    assert done.stdout == render.render(REPO / "deploy")


def test_output_orders_what_must_exist_first(base: list[dict[str, Any]]) -> None:
    kinds = [o["kind"] for o in base]
    assert kinds[0] == "Namespace"
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    assert kinds.index("ServiceAccount") < kinds.index("DaemonSet")


def test_every_namespaced_object_is_in_the_system_namespace(base: list[dict[str, Any]]) -> None:
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "CSIDriver",
    }
    for obj in base:
        ns = obj["metadata"].get("namespace")
        assert ns == (None if obj["kind"] in cluster_scoped else "gpustack-system"), obj["metadata"]


def test_the_base_includes_the_three_crds(base: list[dict[str, Any]]) -> None:
    names = {o["metadata"]["name"] for o in base if o["kind"] == "CustomResourceDefinition"}
    assert names == {
        "devices.worker.gpustack.ai",
        "nodemodelstores.worker.gpustack.ai",
        "modelartifacts.worker.gpustack.ai",
    }


def test_websocket_overlay_adds_listener_port_and_certificate(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    base, ws = trees["deploy"], trees["deploy/overlays/websocket"]
    assert (
        "websocket {"
        not in find(base, "ConfigMap", "gpustack-nats-config")["data"]["websocket.conf"]
    )
    conf = find(ws, "ConfigMap", "gpustack-nats-config")["data"]
    assert "websocket {" in conf["websocket.conf"] and "auth.conf" in conf
    nats = pod_spec(find(ws, "StatefulSet", "gpustack-nats"))["containers"][0]
    assert [p["containerPort"] for p in nats["ports"]] == [4222, 6222, 8222, 8080]
    assert {m["name"] for m in nats["volumeMounts"]} == {"config", "data", "pid", "websocket-tls"}
    service = find(ws, "Service", "gpustack-nats")
    assert [p["port"] for p in service["spec"]["ports"]] == [4222, 7777, 8080]


def test_worker_gateway_overlay_fills_the_sidecar_slot(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    spec = pod_spec(
        find(trees["deploy/overlays/worker-gateway"], "Deployment", "gpustack-operator-worker")
    )
    worker, gateway = spec["containers"]
    assert (worker["name"], gateway["name"]) == ("worker", "worker-gateway")
    assert {m["name"] for m in gateway["volumeMounts"]} >= {"run"}
    base_spec = pod_spec(find(trees["deploy"], "Deployment", "gpustack-operator-worker"))
    assert [c["name"] for c in base_spec["containers"]] == ["worker"]
    assert any(v["name"] == "run" for v in base_spec["volumes"])


def test_simulated_overlay_runs_everywhere_without_the_runtime(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    spec = pod_spec(
        find(
            trees["deploy/overlays/simulated"],
            "DaemonSet",
            "gpustack-operator-device-manager-nvidia",
        )
    )
    assert "runtimeClassName" not in spec and "nodeSelector" not in spec
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["GPUSTACK_SIMULATE"] == "nvidia-h100x8-mig"
    assert "NVIDIA_VISIBLE_DEVICES" not in env


def test_image_transformer_sets_the_tag_on_every_operator_container(
    base: list[dict[str, Any]],
) -> None:
    images = {
        c["image"]
        for o in base
        if o["kind"] in {"Deployment", "DaemonSet"}
        for c in pod_spec(o)["containers"]
        if c["image"].startswith("gpustack/")
    }
    assert images == {"gpustack/gpustack-operator:0.1.0"}


# The renderer itself, on small trees.


def _tree(tmp_path: Path, kustomization: dict[str, Any], files: dict[str, Any]) -> Path:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    for name, docs in files.items():
        (tmp_path / name).write_text(yaml.safe_dump_all(docs))
    return tmp_path


def _deployment(containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "n"},
        "spec": {"template": {"spec": {"containers": containers}}},
    }


def test_patch_merges_lists_by_merge_key_and_replaces_primitive_lists(tmp_path: Path) -> None:
    base = _deployment(
        [{"name": "a", "image": "x:1", "args": ["one"], "env": [{"name": "A", "value": "1"}]}]
    )
    patch = _deployment(
        [
            {"name": "a", "args": ["two"], "env": [{"name": "B", "value": "2"}]},
            {"name": "b", "image": "y:1"},
        ]
    )
    root = _tree(
        tmp_path,
        {"resources": ["d.yaml"], "patches": [{"path": "p.yaml"}]},
        {"d.yaml": [base], "p.yaml": [patch]},
    )
    (obj,) = render.build(root)
    a, b = pod_spec(obj)["containers"]
    assert a == {
        "name": "a",
        "image": "x:1",
        "args": ["two"],
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
    }
    assert b == {"name": "b", "image": "y:1"}


def test_null_deletes_a_key_and_patch_delete_drops_an_element() -> None:
    base = {"a": 1, "b": 2, "env": [{"name": "X"}, {"name": "Y"}]}
    patch = {"a": None, "env": [{"name": "X", "$patch": "delete"}]}
    assert render.merge(base, patch) == {"b": 2, "env": [{"name": "Y"}]}


@pytest.mark.parametrize(
    ("kustomization", "message"),
    [
        ({"resources": ["d.yaml"], "namePrefix": "x-"}, "not supported"),
        ({"resources": ["missing.yaml"]}, "does not exist"),
        ({"resources": ["d.yaml", "d.yaml"]}, "duplicate"),
        ({"resources": ["d.yaml"], "patches": [{"path": "other.yaml"}]}, "no object"),
        ({"resources": ["d.yaml"], "patches": [{"patch": "inline"}]}, "only '- path"),
    ],
)
def test_what_it_does_not_implement_is_refused(
    tmp_path: Path, kustomization: dict[str, Any], message: str
) -> None:
    other = _deployment([])
    other["metadata"]["name"] = "other"
    root = _tree(tmp_path, kustomization, {"d.yaml": [_deployment([])], "other.yaml": [other]})
    with pytest.raises(render.RenderError, match=message):
        render.build(root)


def test_images_replace_name_and_tag(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"resources": ["d.yaml"], "images": [{"name": "x", "newName": "reg/x", "newTag": "2"}]},
        {"d.yaml": [_deployment([{"name": "a", "image": "x:1"}, {"name": "b", "image": "xy"}])]},
    )
    (obj,) = render.build(root)
    assert [c["image"] for c in pod_spec(obj)["containers"]] == ["reg/x:2", "xy"]

"""The kustomize layout, built by the real ``kubectl kustomize``: every root builds, the overlays
extend the base, and what each overlay changes."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import (
    BASE,
    CRDS,
    INSTALLS,
    OVERLAYS,
    TREES,
    built_text,
    find,
    kubectl,
    kustomize,
    pod_spec,
)

from controlplane.schema import crds


def _identities(objs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs}


def test_kubectl_is_the_one_installed_with_the_dev_extra() -> None:
    assert Path(kubectl()).parent == Path(sysconfig.get_path("scripts"))


def test_every_root_under_deploy_is_known() -> None:
    """A new kustomization root must be added here on purpose: it is then built by every test
    that runs over ``TREES`` (and, if it is a complete install, over ``INSTALLS``)."""
    assert set(TREES) == {BASE, CRDS, *OVERLAYS}
    assert set(OVERLAYS) == {
        "deploy/overlays/applications",
        "deploy/overlays/dashboard",
        "deploy/overlays/kueue",
        "deploy/overlays/monitoring",
        "deploy/overlays/simulated",
        "deploy/overlays/websocket",
        "deploy/overlays/worker-gateway",
    }


@pytest.mark.parametrize("tree", TREES)
def test_kubectl_kustomize_builds_the_root(tree: str) -> None:
    docs = [d for d in yaml.safe_load_all(built_text(tree)) if d is not None]
    assert docs and all({"apiVersion", "kind", "metadata"} <= set(d) for d in docs)


def test_an_overlay_inside_its_base_is_refused(tmp_path: Path) -> None:
    """The layout this repository had: the base at ``deploy/`` with overlays below it. The real
    kustomize refuses it (the hand-written renderer the tests used then did not)."""
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(configmap))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["c.yaml"]}))
    overlay = tmp_path / "overlays" / "x"
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["../.."]}))
    assert kustomize(tmp_path).returncode == 0
    done = kustomize(overlay)
    assert done.returncode != 0 and "cycle detected" in done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_holds_everything_the_base_does(
    trees: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    assert _identities(trees[BASE]) <= _identities(trees[overlay])


def test_the_crds_root_is_exactly_the_base_crds(trees: dict[str, list[dict[str, Any]]]) -> None:
    in_base = [o for o in trees[BASE] if o["kind"] == "CustomResourceDefinition"]
    assert trees[CRDS] == in_base and len(in_base) == len(crds.definitions())


@pytest.mark.parametrize("tree", INSTALLS)
def test_output_orders_what_must_exist_first(
    trees: dict[str, list[dict[str, Any]]], tree: str
) -> None:
    kinds = [o["kind"] for o in trees[tree]]
    assert kinds[0] == "Namespace"
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    assert kinds.index("ServiceAccount") < kinds.index("DaemonSet")
    assert kinds.index("ClusterRole") < kinds.index("Deployment")


def test_every_namespaced_object_is_in_the_system_namespace(base: list[dict[str, Any]]) -> None:
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "CSIDriver",
        "RuntimeClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "APIService",
    }
    # The one exception: reading the front-proxy configuration is granted where it lives.
    elsewhere = {("RoleBinding", "gpustack-operator-worker-auth-reader"): "kube-system"}
    for obj in base:
        ns = obj["metadata"].get("namespace")
        expected = None if obj["kind"] in cluster_scoped else "gpustack-system"
        expected = elsewhere.get((obj["kind"], obj["metadata"]["name"]), expected)
        assert ns == expected, obj["metadata"]


def test_the_base_includes_every_crd(base: list[dict[str, Any]]) -> None:
    names = {o["metadata"]["name"] for o in base if o["kind"] == "CustomResourceDefinition"}
    assert names == {
        "devices.worker.gpustack.ai",
        "nodemodelstores.worker.gpustack.ai",
        "modelartifacts.worker.gpustack.ai",
        "instancetypes.worker.gpustack.ai",
        "instancetypeflavors.worker.gpustack.ai",
        "modelstores.worker.gpustack.ai",
        "modelstorebindings.worker.gpustack.ai",
        "modelprefetches.worker.gpustack.ai",
    }


def test_websocket_overlay_adds_listener_port_and_certificate(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    base, ws = trees[BASE], trees["deploy/overlays/websocket"]
    assert (
        "websocket {"
        not in find(base, "ConfigMap", "gpustack-nats-config")["data"]["websocket.conf"]
    )
    conf = find(ws, "ConfigMap", "gpustack-nats-config")["data"]
    assert "websocket {" in conf["websocket.conf"] and "auth.conf" in conf
    nats = pod_spec(find(ws, "StatefulSet", "gpustack-nats"))["containers"][0]
    # kustomize puts list elements a patch adds first; the order of ports carries no meaning.
    assert sorted(p["containerPort"] for p in nats["ports"]) == [4222, 6222, 8080, 8222]
    assert {m["name"] for m in nats["volumeMounts"]} == {"config", "data", "pid", "websocket-tls"}
    service = find(ws, "Service", "gpustack-nats")
    assert sorted(p["port"] for p in service["spec"]["ports"]) == [4222, 7777, 8080]


def test_worker_gateway_overlay_fills_the_sidecar_slot(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    spec = pod_spec(
        find(trees["deploy/overlays/worker-gateway"], "Deployment", "gpustack-operator-worker")
    )
    # The worker stays the first container: the default of `kubectl logs` and `kubectl exec`.
    worker, gateway = spec["containers"]
    assert (worker["name"], gateway["name"]) == ("worker", "worker-gateway")
    assert gateway["image"] == "gpustack/gpustack-operator:0.1.0"
    assert {m["name"] for m in gateway["volumeMounts"]} == {"run", "tmp"}
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    # Loopback: it reads this cluster with the worker's ServiceAccount; no bus, no token.
    assert env == {
        "GPUSTACK_BIND_UNIX_PATH": "/var/lib/gpustack/gpustack-operator-worker-gateway.sock",
        "GPUSTACK_WORKER_CONN_MODE": "loopback",
    }
    role = find(trees["deploy/overlays/worker-gateway"], "ClusterRole",
                "gpustack-operator-worker-gateway")  # fmt: skip
    assert role["rules"] == [{"apiGroups": ["apiregistration.k8s.io"],
                              "resources": ["apiservices"],
                              "resourceNames": ["v1.worker.gpustack.ai", "v1.gpustack.ai"],
                              "verbs": ["get"]}]  # fmt: skip
    base_spec = pod_spec(find(trees[BASE], "Deployment", "gpustack-operator-worker"))
    assert [c["name"] for c in base_spec["containers"]] == ["worker"]
    # The worker gains one variable: where the gateway's socket is (it mirrors the aggregate).
    gained = [e for e in worker["env"] if e not in base_spec["containers"][0]["env"]]
    assert gained == [
        {
            "name": "GPUSTACK_WORKER_GATEWAY_UNIX_PATH",
            "value": "/var/lib/gpustack/gpustack-operator-worker-gateway.sock",
        }
    ]
    assert {**worker, "env": base_spec["containers"][0]["env"]} == base_spec["containers"][0]
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


@pytest.mark.parametrize("tree", INSTALLS)
def test_image_transformer_sets_the_tag_on_every_operator_container(
    trees: dict[str, list[dict[str, Any]]], tree: str
) -> None:
    images = {
        c["image"]
        for o in trees[tree]
        if o["kind"] in {"Deployment", "DaemonSet"}
        for c in pod_spec(o)["containers"]
        if c["image"].startswith("gpustack/")
    }
    assert images == {"gpustack/gpustack-operator:0.1.0"}

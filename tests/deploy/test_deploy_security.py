"""Least privilege, as the manifests state it: RBAC, privileges, host mounts, probes, resources."""

from __future__ import annotations

from typing import Any

import pytest
from deploy_helpers import INSTALLS, build, find, pod_spec, workloads

from agent.devices.manufacturers import MANUFACTURERS

AGENTS = ("gpustack-operator-device-manager", "gpustack-operator-model-manager")
DM_HOST_MOUNTS = {
    "/var/lib/kubelet/device-plugins": False,
    "/var/lib/kubelet/pod-resources": True,
    "/sys": True,
    "/dev": True,
    "/var/lib/gpustack/operator/lib": False,
    "/var/lib/gpustack/operator/pods": False,
}
PORTS = {"worker": 31443, "device-manager": 32443, "model-manager": 32444}
PCI_VENDOR = {m.key: f"{m.pci_vendor:04x}" for m in MANUFACTURERS.values()}
RUNTIME_CLASS = {"nvidia": "nvidia", "mthreads": "mthreads"}
"""The agents whose vendor runtime injects their management library (the others mount it)."""
VENDOR_LIBRARIES = {
    "ascend": ("/usr/local/Ascend/driver",),
    "cambricon": ("/usr/local/neuware",),
    "hygon": ("/opt/hyhal",),
    "iluvatar": ("/usr/local/corex",),
    "metax": ("/opt/mxdriver",),
    "thead": ("/usr/local/PPU_SDK",),
}
"""Read-only host trees holding the vendor library detection loads."""


def _bindings(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in {"RoleBinding", "ClusterRoleBinding"}]


@pytest.mark.parametrize("tree", INSTALLS)
def test_agents_have_no_rbac_bindings_and_no_token(tree: str) -> None:
    objs = build(tree)
    bound = {s["name"] for b in _bindings(objs) for s in b.get("subjects", [])}
    # The monitoring overlay's scraper account may get /metrics and nothing else
    # (test_deploy_monitoring.py): it runs no pod.
    scraper = {"gpustack-operator-metrics-scraper"} if tree.endswith("/monitoring") else set()
    assert bound == {"gpustack-operator-worker", *scraper}
    for sa in AGENTS:
        assert find(objs, "ServiceAccount", sa).get("automountServiceAccountToken") is False
    for obj in workloads(objs):
        if pod_spec(obj)["serviceAccountName"] in AGENTS:
            assert pod_spec(obj)["automountServiceAccountToken"] is False


def test_worker_rbac_is_what_the_control_plane_needs(base: list[dict[str, Any]]) -> None:
    rules = find(base, "ClusterRole", "gpustack-operator-worker")["rules"]
    granted = {
        (group, res, verb)
        for r in rules
        for group in r["apiGroups"]
        for res in r["resources"]
        for verb in r["verbs"]
    }
    assert all(r["verbs"] != ["*"] and r["resources"] != ["*"] for r in rules)
    for res in ("devices", "nodemodelstores", "modelartifacts"):
        assert ("worker.gpustack.ai", res, "watch") in granted
        assert ("worker.gpustack.ai", f"{res}/status", "patch") in granted
    assert {("", "nodes", v) for v in ("get", "list", "watch", "patch")} <= granted
    assert ("", "nodes", "delete") not in granted and ("", "secrets", "get") not in granted
    assert ("", "nodes/status", "patch") in granted
    assert ("apiextensions.k8s.io", "customresourcedefinitions", "delete") not in granted
    leases = find(base, "Role", "gpustack-operator-worker-leader-election")
    assert leases["metadata"]["namespace"] == "gpustack-system"
    assert leases["rules"][0]["resources"] == ["leases"]


@pytest.mark.parametrize("mfr", sorted(MANUFACTURERS))
def test_device_manager_is_unprivileged_and_mounts_exactly_its_list(
    base: list[dict[str, Any]], mfr: str
) -> None:
    spec = pod_spec(find(base, "DaemonSet", f"gpustack-operator-device-manager-{mfr}"))
    vendor = PCI_VENDOR[mfr]
    assert spec["nodeSelector"] == {f"feature.node.kubernetes.io/pci-{vendor}.present": "true"}
    assert spec.get("runtimeClassName") == RUNTIME_CLASS.get(mfr)
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert f"--manufacturer={mfr}" in c["args"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounted = {
        host[m["name"]]: m.get("readOnly", False) for m in c["volumeMounts"] if m["name"] in host
    }
    state = f"/var/lib/gpustack/device-manager/{mfr}"  # per manufacturer: both may share a node
    libraries = dict.fromkeys(VENDOR_LIBRARIES.get(mfr, ()), True)
    assert mounted == {**DM_HOST_MOUNTS, state: False, **libraries}
    assert set(host.values()) == {*DM_HOST_MOUNTS, state, *libraries}


def test_runtime_classes_exist_exactly_where_the_runtime_injects(
    base: list[dict[str, Any]],
) -> None:
    classes = {o["metadata"]["name"]: o for o in base if o["kind"] == "RuntimeClass"}
    # NVIDIA's comes with NVIDIA's toolkit; these three with ours, for their workloads.
    assert sorted(classes) == ["ascend", "iluvatar", "mthreads"]
    for name, obj in classes.items():
        assert obj["handler"] == name
        selector = obj["scheduling"]["nodeSelector"]
        assert selector == {f"feature.node.kubernetes.io/pci-{PCI_VENDOR[name]}.present": "true"}


def test_model_manager_mounts_kubelet_pods_bidirectionally(base: list[dict[str, Any]]) -> None:
    spec = pod_spec(find(base, "DaemonSet", "gpustack-operator-model-manager"))
    mm, registrar = spec["containers"]
    assert (mm["name"], registrar["name"]) == ("model-manager", "node-driver-registrar")
    assert mm["securityContext"]["privileged"] is True  # required by Bidirectional
    pods = next(m for m in mm["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pods")
    assert pods["mountPropagation"] == "Bidirectional"
    assert not any(m.get("mountPropagation") == "Bidirectional" for m in registrar["volumeMounts"])
    assert "privileged" not in registrar["securityContext"]
    assert (
        "--kubelet-registration-path=/var/lib/kubelet/plugins/model.csi.gpustack.ai/csi.sock"
        in registrar["args"]
    )


def test_csi_driver_object(base: list[dict[str, Any]]) -> None:
    spec = find(base, "CSIDriver", "model.csi.gpustack.ai")["spec"]
    assert spec["attachRequired"] is False and spec["podInfoOnMount"] is True
    assert spec["volumeLifecycleModes"] == ["Ephemeral"]


@pytest.mark.parametrize("tree", INSTALLS)
def test_every_container_has_requests_limits_and_no_floating_tag(tree: str) -> None:
    for obj in workloads(build(tree)):
        for c in pod_spec(obj)["containers"] + pod_spec(obj).get("initContainers", []):
            where = f"{obj['metadata']['name']}/{c['name']}"
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), where
            assert "memory" in c["resources"]["limits"], where
            assert ":" in c["image"] and not c["image"].endswith(":latest"), where


@pytest.mark.parametrize("component", sorted(PORTS))
def test_probes_and_scrape_annotations_use_the_https_port(
    base: list[dict[str, Any]], component: str
) -> None:
    port = PORTS[component]
    service = find(base, "Service", f"gpustack-operator-{component}")
    notes = service["metadata"]["annotations"]
    assert notes == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
        "prometheus.io/scheme": "https",
    }
    pods = [
        o
        for o in workloads(base)
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert pods
    for obj in pods:
        c = pod_spec(obj)["containers"][0]
        assert c["ports"] == [{"name": "https", "containerPort": port}]
        assert c["readinessProbe"]["httpGet"] == {
            "path": "/readyz",
            "port": "https",
            "scheme": "HTTPS",
        }
        assert c["livenessProbe"]["httpGet"] == {
            "path": "/livez",
            "port": "https",
            "scheme": "HTTPS",
        }


def test_worker_runs_two_replicas_non_root(base: list[dict[str, Any]]) -> None:
    worker = find(base, "Deployment", "gpustack-operator-worker")
    assert worker["spec"]["replicas"] == 2
    spec = pod_spec(worker)
    assert spec["securityContext"]["runAsNonRoot"] is True
    (c,) = spec["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUSTACK_KUBE_LEADER_ELECTION"] == "true"


def test_nats_is_a_three_member_cluster(base: list[dict[str, Any]]) -> None:
    sts = find(base, "StatefulSet", "gpustack-nats")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "gpustack-nats-headless"
    assert find(base, "Service", "gpustack-nats-headless")["spec"]["clusterIP"] == "None"
    conf = find(base, "ConfigMap", "gpustack-nats-config")["data"]["nats.conf"]
    for i in range(3):
        assert f"gpustack-nats-{i}.gpustack-nats-headless.gpustack-system.svc" in conf
    assert pod_spec(sts)["securityContext"]["runAsNonRoot"] is True

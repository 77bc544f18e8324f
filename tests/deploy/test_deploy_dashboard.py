"""The dashboard overlay: one Pod serving the page, on the bus as the read-only identity."""

from __future__ import annotations

from typing import Any

from deploy_helpers import find, pod_spec

from controlplane.access import busauth

OVERLAY = "deploy/overlays/dashboard"


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_the_dashboard_proves_the_read_only_identity_with_a_bus_only_token(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    objs = trees[OVERLAY]
    spec = pod_spec(find(objs, "Deployment", "gpustack-operator-dashboard"))
    # The ServiceAccount the worker's callout maps to the dashboard role, and that has no API
    # rights (no binding names it), nor an API token in the Pod.
    assert busauth.ROLES_BY_SERVICE_ACCOUNT[spec["serviceAccountName"]] == "dashboard"
    assert spec["automountServiceAccountToken"] is False
    bindings = [o for o in objs if o["kind"] in {"RoleBinding", "ClusterRoleBinding"}]
    assert not [
        b
        for b in bindings
        for s in b.get("subjects", [])
        if s["name"] == spec["serviceAccountName"]
    ]
    (container,) = spec["containers"]
    assert container["args"][0] == "dashboard"
    env = _env(container)
    (token,) = [v for v in spec["volumes"] if v["name"] == "nats-token"]
    (source,) = token["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "gpustack-nats"
    (mount,) = container["volumeMounts"]
    assert (
        env["GPUSTACK_NATS_TOKEN_FILE"]
        == f"{mount['mountPath']}/{source['serviceAccountToken']['path']}"
    )
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_page_is_reached_inside_the_cluster_on_the_probed_port(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    objs = trees[OVERLAY]
    (container,) = pod_spec(find(objs, "Deployment", "gpustack-operator-dashboard"))["containers"]
    (port,) = container["ports"]
    assert int(_env(container)["GPUSTACK_PORT"]) == port["containerPort"]
    assert container["readinessProbe"]["httpGet"]["port"] == port["name"]
    service = find(objs, "Service", "gpustack-operator-dashboard")
    assert service["spec"]["type"] == "ClusterIP"  # never exposed beyond the cluster by default
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]

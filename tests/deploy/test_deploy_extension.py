"""The extension API, status guards, settings and applications as shipped: in sync with the code,
pointing at the worker's Service, and the worker's rights exactly what the code does."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from deploy_helpers import BASE, REPO, build, find, pod_spec
from test_deploy_rbac import allows

from controlplane import applications
from controlplane.admission import modelrules
from controlplane.admission.webhooks import WebhookSettings
from controlplane.errors import NotFound
from controlplane.extension import guards, registration
from controlplane.k8s.client import KubeClient
from controlplane.resources import Ref

pytestmark = pytest.mark.anyio
SHIPPED = REPO / "deploy" / "base"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(Path(SHIPPED / name).read_text()) if d]


def test_shipped_apiservice_and_guards_are_the_code_without_a_ca() -> None:
    assert _docs("apiservice.yaml") == [registration.apiservice(WebhookSettings(), None)]
    assert _docs("status-guards.yaml") == [guards.configuration(WebhookSettings(), None)]
    assert _docs("model-rules.yaml") == [modelrules.configuration(WebhookSettings(), None)]


def test_apiservice_and_guards_point_at_the_worker_service() -> None:
    base = build(BASE)
    service = find(base, "Service", "gpustack-operator-worker")
    ports = [p["port"] for p in service["spec"]["ports"]]
    target = find(base, "APIService", registration.APISERVICE_NAME)["spec"]["service"]
    assert (target["namespace"], target["name"]) == (
        service["metadata"]["namespace"], service["metadata"]["name"],
    )  # fmt: skip
    assert target["port"] in ports
    for name in (guards.NAME, modelrules.NAME):
        hooks = find(base, "ValidatingWebhookConfiguration", name)["webhooks"]
        assert {h["clientConfig"]["service"]["port"] for h in hooks} <= set(ports)
        assert all(h["failurePolicy"] == "Fail" for h in hooks)


class _Recorder:
    def __init__(self) -> None:
        self.applied: list[Ref] = []

    async def apply(self, ref: Ref, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        assert body["metadata"]["name"] == ref.name
        self.applied.append(ref)
        return body

    async def get(self, ref: Ref) -> dict[str, Any]:
        raise NotFound(f"{ref.name} not found")


async def test_what_the_worker_applies_at_start_is_allowed() -> None:
    recorder = _Recorder()
    api = cast(KubeClient, recorder)
    await registration.ensure(api, WebhookSettings(), b"ca")
    await guards.ensure(api, WebhookSettings(), b"ca")
    await modelrules.ensure(api, WebhookSettings(), b"ca")
    # The applications the base's worker installs: none (--disable-applications=*; the
    # applications overlay grants cluster-admin for them).
    objs = build(BASE)
    container = pod_spec(find(objs, "Deployment", "gpustack-operator-worker"))["containers"][0]
    assert "--disable-applications=*" in container["args"]
    await applications.ensure(api, frozenset(), namespace="gpustack-system")
    rules = find(build(BASE), "ClusterRole", "gpustack-operator-worker")["rules"]
    own = find(build(BASE), "Role", "gpustack-operator-worker-webhook-ca")["rules"]
    namespaced = [ref for ref in recorder.applied if ref.namespace]
    assert [ref.name for ref in namespaced] == ["gpustack-applications"]
    for verb in ("get", "patch", "create"):
        assert allows(own, (verb, "", "configmaps", "gpustack-applications"))
    for ref in [ref for ref in recorder.applied if not ref.namespace]:
        for verb in ("patch", "create"):
            request = (verb, ref.resource.group, ref.resource.plural, ref.name)
            assert allows(rules, request), request
            assert not allows(rules, (verb, ref.resource.group, ref.resource.plural, "other"))
    assert allows(rules, ("create", "authentication.k8s.io", "selfsubjectreviews", ""))


def test_the_worker_reads_and_patches_only_its_settings_secret() -> None:
    role = find(build(BASE), "Role", "gpustack-operator-worker-webhook-ca")
    rules = role["rules"]
    assert allows(rules, ("get", "", "secrets", "gpustack-settings"))
    assert allows(rules, ("patch", "", "secrets", "gpustack-settings"))
    assert not allows(rules, ("patch", "", "secrets", "someone-elses"))


def test_the_worker_may_read_the_front_proxy_configuration() -> None:
    binding = find(build(BASE), "RoleBinding", "gpustack-operator-worker-auth-reader")
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    assert binding["subjects"][0]["name"] == "gpustack-operator-worker"


def test_viewers_may_read_the_extension_api() -> None:
    role = find(build(BASE), "ClusterRole", "gpustack-operator-extension-view")
    assert role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert allows(role["rules"], ("list", "gpustack.ai", "nodeutilizations", ""))
    assert not allows(role["rules"], ("patch", "gpustack.ai", "settings", "x"))


def test_the_worker_group_apiservice_is_the_code_and_points_at_the_worker() -> None:
    from controlplane.extension.workergroup import registration as group

    assert _docs("worker-apiservice.yaml") == [group.apiservice(WebhookSettings(), None)]
    base = build(BASE)
    service = find(base, "Service", "gpustack-operator-worker")
    target = find(base, "APIService", group.APISERVICE_NAME)["spec"]
    assert target["service"]["name"] == service["metadata"]["name"]
    assert target["service"]["port"] in [p["port"] for p in service["spec"]["ports"]]
    # below the CRDs' v1alpha1 (100): v1 is served, not preferred (see registration.py)
    assert (target["groupPriorityMinimum"], target["versionPriority"]) == (1000, 15)


async def test_the_worker_may_apply_the_worker_group_apiservice() -> None:
    from controlplane.extension.workergroup import registration as group

    recorder = _Recorder()
    await group.ensure(cast(KubeClient, recorder), WebhookSettings(), b"ca")
    rules = find(build(BASE), "ClusterRole", "gpustack-operator-worker")["rules"]
    (ref,) = recorder.applied
    for verb in ("patch", "create"):
        assert allows(rules, (verb, ref.resource.group, ref.resource.plural, ref.name))


def test_view_and_edit_aggregate_the_worker_group() -> None:
    base = build(BASE)
    view = find(base, "ClusterRole", "gpustack-operator-worker-api-view")
    edit = find(base, "ClusterRole", "gpustack-operator-worker-api-edit")
    labels = view["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    g = "worker.gpustack.ai"
    for resource in ("devices", "nodemodelstores", "modelartifacts", "instancetypes",
                     "instancetypeflavors"):  # fmt: skip
        for verb in ("get", "list", "watch"):
            assert allows(view["rules"], (verb, g, resource, ""))
    assert allows(view["rules"], ("get", g, "modelartifacts/progress", "m"))
    assert not allows(view["rules"], ("delete", g, "nodemodelstores", "n"))
    assert allows(edit["rules"], ("delete", g, "nodemodelstores", "n"))
    assert not allows(edit["rules"], ("delete", g, "devices", "n"))

"""The Pod webhook configurations as shipped: in sync with the code, pointing at the worker's
Service, sending exactly the Pods that request one of our families, and the worker's rights on
them and on its CA Secret exactly what ``controlplane/admission`` does with them.

``matchConditions`` are evaluated with ``cel-python`` over Pods as the API server hands them to
CEL (requests already defaulted from limits).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import celpy
import pytest
import yaml
from deploy_helpers import BASE, REPO, build, find
from test_deploy_rbac import Request, allows

from controlplane import errors
from controlplane.admission import certificates, webhooks
from controlplane.k8s.client import KubeClient
from controlplane.resources import Ref

pytestmark = pytest.mark.anyio
SHIPPED = REPO / "deploy" / "base" / "webhooks.yaml"


def test_shipped_configurations_are_the_code_without_a_ca() -> None:
    shipped = [d for d in yaml.safe_load_all(Path(SHIPPED).read_text()) if d]
    assert shipped == list(webhooks.configurations(webhooks.WebhookSettings(), None).values())


def test_configurations_point_at_the_worker_service_and_fail_closed() -> None:
    base = build(BASE)
    service = find(base, "Service", "gpustack-operator-worker")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (config,) = [  # the status guards and model rules are tested with the extension API
            o
            for o in base
            if o["kind"] == kind
            and o["metadata"]["name"]
            not in {"gpustack-worker-status-guards", "gpustack-worker-model-rules"}
        ]
        (hook,) = config["webhooks"]
        target = hook["clientConfig"]["service"]
        assert (target["namespace"], target["name"]) == (
            service["metadata"]["namespace"], service["metadata"]["name"],
        )  # fmt: skip
        assert target["port"] in [p["port"] for p in service["spec"]["ports"]]
        assert hook["failurePolicy"] == "Fail" and hook["rules"][0]["operations"] == ["CREATE"]
    # Mutating configurations run in name order: ours before Kueue's, so Kueue sees the units.
    assert webhooks.MUTATING_NAME < "kueue-mutating-webhook-configuration"


def _matches(obj: dict[str, Any]) -> bool:
    (expression,) = {
        hook["matchConditions"][0]["expression"]
        for config in webhooks.configurations(webhooks.WebhookSettings(), None).values()
        for hook in config["webhooks"]
    }
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return bool(program.evaluate({"object": celpy.json_to_cel(obj)}))


def _pod(*containers: dict[str, str] | None, init: dict[str, str] | None = None) -> dict[str, Any]:
    def c(requests: dict[str, str] | None) -> dict[str, Any]:
        return (
            {"name": "c"}
            if requests is None
            else {"name": "c", "resources": {"requests": requests}}
        )

    spec: dict[str, Any] = {"containers": [c(r) for r in containers]}
    if init is not None:
        spec["initContainers"] = [c(init)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize(
    ("obj", "sent"),
    [
        (_pod({"nvidia.com/gpu": "1"}), True),
        (_pod({"cpu": "1"}, {"nvidia.com/gpu.sliced": "1"}), True),
        (_pod({"amd.com/gpu.shared": "2"}), True),
        (_pod({"huawei.com/npu.partitioned.mig-1g": "1"}), True),
        (_pod({"cpu": "1"}, init={"nvidia.com/gpu": "1"}), True),
        (_pod(None), False),
        (_pod({"cpu": "1", "memory": "1Gi"}), False),
        (_pod({"device.gpustack.ai/nvidia.visibility": "1"}), False),
        (_pod({"example.com/gpu": "1", "nvidia.com/gpux": "1"}), False),
        (_pod({"cpu": "1"}, init={"cpu": "1"}), False),
    ],
)
def test_match_conditions_send_only_pods_requesting_our_families(obj: Any, sent: bool) -> None:
    assert _matches(obj) is sent


def _rules(kind: str, name: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = find(build(BASE), kind, name)["rules"]
    return rules


class _Recorder:
    """The calls ``controlplane.admission`` makes on the API, recorded; the Secret is absent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Ref]] = []

    async def get(self, ref: Ref) -> dict[str, Any]:
        self.calls.append(("get", ref))
        raise errors.NotFound(404, "not found")

    async def create(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", ref))
        return body

    async def apply(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("apply", ref))
        assert body["metadata"]["name"] == ref.name
        return body


def _authorizations(call: str, ref: Ref) -> list[Request]:
    """What the API server authorizes: an apply may create (both checks, with the name); a
    POST create carries no name."""
    group, plural = ref.resource.group, ref.resource.plural
    if call == "create":
        return [("create", group, plural, "")]
    verbs = {"get": ["get"], "apply": ["patch", "create"]}[call]
    return [(verb, group, plural, ref.name) for verb in verbs]


async def test_what_the_worker_does_at_start_is_allowed_and_no_more() -> None:
    recorder = _Recorder()
    api = cast(KubeClient, recorder)
    settings = webhooks.WebhookSettings()
    await certificates.authority(api, settings.namespace)
    await webhooks.ensure(api, settings, b"ca")
    assert [(call, ref.resource.plural) for call, ref in recorder.calls] == [
        ("get", "secrets"), ("create", "secrets"),
        ("apply", "mutatingwebhookconfigurations"), ("apply", "validatingwebhookconfigurations"),
    ]  # fmt: skip
    cluster = _rules("ClusterRole", "gpustack-operator-worker")
    ca_role = find(build(BASE), "Role", "gpustack-operator-worker-webhook-ca")
    assert ca_role["metadata"]["namespace"] == settings.namespace
    for call, ref in recorder.calls:
        rules = ca_role["rules"] if ref.namespace else cluster
        for request in _authorizations(call, ref):
            assert allows(rules, request), request
    for verb in ("update", "delete", "list", "watch"):
        for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            name = (
                "gpustack-worker-mutation"
                if plural.startswith("m")
                else "gpustack-worker-validation"
            )
            assert not allows(cluster, (verb, "admissionregistration.k8s.io", plural, name))
    assert not allows(
        cluster,
        (
            "patch",
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "kueue-mutating-webhook-configuration",
        ),
    )
    assert not allows(cluster, ("get", "", "secrets", certificates.CA_SECRET))
    assert not allows(ca_role["rules"], ("get", "", "secrets", "gpustack-nats-auth"))
    assert not allows(ca_role["rules"], ("list", "", "secrets", ""))

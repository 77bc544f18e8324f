"""Status guards: only the model-manager's ServiceAccount (and the worker, on the agents' behalf)
writes a NodeModelStore's status; only the worker writes a ModelArtifact's.

AdmissionReviews are POSTed over real HTTPS to a running worker (fake API, real nats-server), as
the API server sends them for a ``/status`` UPDATE; the worker learned its own name by
SelfSubjectReview.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_controlplane_extension_api import client_context, cluster

from controlplane.admission.webhooks import WebhookSettings
from controlplane.extension import guards

pytestmark = pytest.mark.anyio
WORKER = "system:serviceaccount:gpustack-system:gpustack-operator-worker"
MM = "system:serviceaccount:ns:gpustack-operator-model-manager"


def review(resource: str, user: str, sub: str = "status") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "worker.gpustack.ai", "version": "v1alpha1", "kind": "X"},
            "resource": {"group": "worker.gpustack.ai", "version": "v1alpha1",
                         "resource": resource},
            "subResource": sub, "operation": "UPDATE", "name": "n1",
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
        },
    }  # fmt: skip


async def _ask(url: str, tmp_path: Path, body: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        answer = await http.post(url + guards.PATH, json=body, ssl=client_context(tmp_path, None))
        if answer.status != 200:
            return answer.status, {}
        return answer.status, (await answer.json())["response"]


async def test_only_the_named_writers_may_write_status(tmp_path: Path) -> None:
    hooks = WebhookSettings(service="gpustack-operator-worker", namespace="ns", port=31443)
    async with cluster(tmp_path, webhooks=hooks) as c:
        answers = {
            (res, who): await _ask(c.url, tmp_path, review(res, user))
            for res in ("nodemodelstores", "modelartifacts")
            for who, user in (("mm", MM), ("worker", WORKER), ("intruder", "alice"))
        }
        spec_edit = await _ask(c.url, tmp_path, review("nodemodelstores", "alice", sub=""))
        malformed = await _ask(c.url, tmp_path, {"kind": "AdmissionReview"})
        config = c.fake.get(
            "apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", guards.NAME
        )
    allowed = {k: v[1]["allowed"] for k, v in answers.items()}
    assert allowed == {
        ("nodemodelstores", "mm"): True, ("nodemodelstores", "worker"): True,
        ("nodemodelstores", "intruder"): False, ("modelartifacts", "mm"): False,
        ("modelartifacts", "worker"): True, ("modelartifacts", "intruder"): False,
    }  # fmt: skip
    refusal = answers[("modelartifacts", "mm")][1]["status"]
    assert refusal["code"] == 403 and WORKER in refusal["message"] and MM in refusal["message"]
    assert spec_edit[1]["allowed"] is True  # the spec is not what this guard is about
    assert malformed[0] == 400
    resources = [hook["rules"][0]["resources"] for hook in config["webhooks"]]
    assert resources == [["nodemodelstores/status"], ["modelartifacts/status"]]
    assert all(hook["clientConfig"]["caBundle"] for hook in config["webhooks"])


async def test_the_model_manager_service_account_flag_names_the_writer(tmp_path: Path) -> None:
    async with cluster(tmp_path, model_manager_service_account="custom-mm") as c:
        custom = await _ask(c.url, tmp_path, review("nodemodelstores",
                                                    "system:serviceaccount:ns:custom-mm"))  # fmt: skip
        default = await _ask(c.url, tmp_path, review("nodemodelstores", MM))
    assert custom[1]["allowed"] is True and default[1]["allowed"] is False


def test_decide_is_pure_and_refuses_other_versions() -> None:
    allowed = guards.allowed_writers(WORKER, "ns", "gpustack-operator-model-manager")
    body = review("modelartifacts", WORKER)
    body["apiVersion"] = "admission.k8s.io/v1beta1"
    with pytest.raises(ValueError, match="v1beta1"):
        guards.decide(json.dumps(body).encode(), allowed)

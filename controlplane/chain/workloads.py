"""The Workload fit-pin webhook: ``POST /webhooks/v1/workloads/mutate`` (``failurePolicy: Ignore``).

Kueue places a Workload by quota and topology; it does not know which node's cards still have a
slice or a share free. This webhook adds, to every PodSet that asks for one, a required
node-affinity requirement on the node's fit labels (:mod:`controlplane.chain.fit`):

- sliced ``U`` units: ``sliced-max-free-units.fit.gpustack.ai/<aKey> Gt U-1``;
- shared ``N`` cards: ``shared-free-cards.fit.gpustack.ai/<aKey> Gt N-1``;

to each of its required terms (a PodSet without any gets one term). ``aKey`` is the accelerator
group of the InstanceType the Workload's LocalQueue enters (``spec.queueName``). It answers a
CREATE, and an UPDATE only while the Workload holds no quota reservation (``status.admission``
unset: Kueue's podSets are immutable after that). Anything else, or a Workload of a queue that is
not ours, is allowed untouched; a malformed review (one whose object is not the resource it names
included) is a 400. Being ``Ignore``, the webhook being
down never blocks a Workload: it is only a placement hint, the admission check is the gate.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any, Final

import msgspec

from controlplane.admission import webhooks
from controlplane.admission.pods import PatchOp, pointer
from controlplane.admission.requests import Family
from controlplane.admission.review import BadReview, Request, Response, answered, request_of
from controlplane.admission.webhooks import WebhookSettings
from controlplane.chain import fit, naming
from controlplane.k8s.client import KubeClient
from controlplane.resources import MUTATING_WEBHOOKS, Ref
from kit.serving import PostRoute
from kit.serving import Response as HttpResponse

__all__ = ["CONFIGURATION_NAME", "PATH", "configuration", "ensure", "pin", "posts"]

log = logging.getLogger(__name__)

PATH: Final = "/webhooks/v1/workloads/mutate"
CONFIGURATION_NAME: Final = "gpustack-worker-workload-mutation"

Entrance = Callable[[str], str | None]


_ENCODE: Final = msgspec.json.Encoder()


def _requirements(demands: list[fit.Demand], group: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in demands:
        if d.family is Family.SLICED:
            key = f"{naming.SLICED_FIT}{group}"
        elif d.family is Family.SHARED:
            key = f"{naming.SHARED_FIT}{group}"
        else:
            continue
        out.append({"key": key, "operator": "Gt", "values": [str(d.amount - 1)]})
    return out


def pin(workload: dict[str, Any], group: str) -> list[PatchOp]:
    """The JSON Patch pinning each PodSet of ``workload`` to nodes that fit it (pure)."""
    ops: list[PatchOp] = []
    for i, pod_set in enumerate((workload.get("spec") or {}).get("podSets") or []):
        spec = (pod_set.get("template") or {}).get("spec") or {}
        wanted = _requirements(fit.demands_of(spec), group)
        if not wanted:
            continue
        affinity = copy.deepcopy(spec.get("affinity") or {})
        node = affinity.setdefault("nodeAffinity", {})
        required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.get("nodeSelectorTerms") or [{}]
        for term in terms:
            exprs = [e for e in term.get("matchExpressions") or [] if e not in wanted]
            exprs = [e for e in exprs if e.get("key") not in {w["key"] for w in wanted}]
            term["matchExpressions"] = [*exprs, *wanted]
        required["nodeSelectorTerms"] = terms
        if affinity == spec.get("affinity"):
            continue
        path = pointer("spec", "podSets", str(i), "template", "spec", "affinity")
        ops.append(PatchOp(op="add", path=path, value=affinity))
    return ops


def _decide(request: Request, entrance: Entrance, enabled: Callable[[], bool]) -> list[PatchOp]:
    kind = request.kind
    if (kind.group, kind.kind) != (naming.KUEUE_GROUP, "Workload") or request.sub_resource:
        return []
    if request.operation not in ("CREATE", "UPDATE") or not enabled():
        return []
    try:
        workload = msgspec.json.decode(request.object)
    except msgspec.DecodeError as e:
        raise BadReview(f"request.object is not JSON: {e}") from e
    if not isinstance(workload, dict):
        raise BadReview("request.object is not a Workload")
    if request.operation == "UPDATE" and (workload.get("status") or {}).get("admission"):
        return []
    group = entrance(str((workload.get("spec") or {}).get("queueName") or ""))
    return pin(workload, group) if group else []


def answer(body: bytes, entrance: Entrance, enabled: Callable[[], bool] = lambda: True) -> bytes:
    """The AdmissionReview answering ``body``. :raises BadReview: not a review."""
    request = request_of(body)
    ops = _decide(request, entrance, enabled)
    response = Response(uid=request.uid, allowed=True)
    if ops:
        response.patch = _ENCODE.encode(ops)
        response.patch_type = "JSONPatch"
    return _ENCODE.encode(answered(response))


def posts(entrance: Entrance, enabled: Callable[[], bool] = lambda: True) -> dict[str, PostRoute]:
    """The route; ``entrance`` maps a LocalQueue name to its accelerator group."""

    async def mutate(body: bytes) -> HttpResponse:
        try:
            out = answer(body, entrance, enabled)
        except BadReview as e:
            return HttpResponse(status=400, body=str(e)[:1024].encode())
        return HttpResponse(body=out, content_type="application/json")

    return {PATH: mutate}


def configuration(settings: WebhookSettings, ca: bytes | None) -> dict[str, Any]:
    """The MutatingWebhookConfiguration: Workloads of our LocalQueues, ``failurePolicy: Ignore``."""
    rules = [{"operations": ["CREATE", "UPDATE"], "apiGroups": [naming.KUEUE_GROUP],
              "apiVersions": [naming.KUEUE_VERSION], "resources": ["workloads"],
              "scope": "Namespaced"}]  # fmt: skip
    ours = (
        "has(object.spec.queueName) && "
        f"object.spec.queueName.startsWith('{naming.LOCAL_QUEUE_PREFIX}')"
    )
    webhook = webhooks.hook(
        "workloads.mutation.worker.gpustack.ai", PATH, settings, ca, rules,
        failure_policy="Ignore", match_conditions=[{"name": "queue-is-ours", "expression": ours}],
    )  # fmt: skip
    webhook["reinvocationPolicy"] = "Never"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": MUTATING_WEBHOOKS.kind,
        "metadata": {"name": CONFIGURATION_NAME, "labels": dict(naming.PART_OF)},
        "webhooks": [webhook],
    }


async def ensure(api: KubeClient, settings: WebhookSettings, ca: bytes) -> None:
    """Apply the configuration (server-side apply, idempotent)."""
    body = configuration(settings, ca)
    await api.apply(Ref(resource=MUTATING_WEBHOOKS, name=CONFIGURATION_NAME), body)
    log.info("Workload webhook configuration applied")

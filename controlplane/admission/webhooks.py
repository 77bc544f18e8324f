"""The Pod webhooks over HTTP, and the configurations that make the API server call them.

``POST /webhooks/v1/pods/mutate`` and ``POST /webhooks/v1/pods/validate`` are served on the
worker's HTTPS port, in every replica and under ``--kubeconfig=none`` (``standalone``), where
they answer from the ledger in the bus. The handlers only decode, call the pure decision and
encode; a malformed body is a 400 with the reason, never an exception.

The configurations (:func:`configurations`, shipped as ``deploy/base/webhooks.yaml`` and applied
by the worker at start with the CA that verifies its certificate):

- ``failurePolicy: Fail``: a Pod asking for fractional GPUs is never admitted unchecked;
- ``matchConditions`` send only Pods that request a key of one of our families, so the webhook
  being down never blocks any other Pod, and the API server skips the call for them;
- the mutating configuration is named ``gpustack-worker-mutation``: configurations run in name
  order, so it runs before Kueue's ``kueue-mutating-webhook-configuration`` and Kueue sees the
  folded units; the validating one runs on the Pod as every mutation left it.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from typing import Any, Final

import msgspec

from controlplane.admission import review
from controlplane.admission.mutating import mutate
from controlplane.admission.pods import Pod
from controlplane.admission.requests import Catalog
from controlplane.admission.validating import validate
from controlplane.families import BASES
from controlplane.k8s.client import KubeClient
from controlplane.resources import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, Ref, Resource
from kit.serving import PostRoute, Response

__all__ = [
    "MUTATE_PATH",
    "MUTATING_NAME",
    "VALIDATE_PATH",
    "VALIDATING_NAME",
    "WebhookSettings",
    "configuration_of",
    "configurations",
    "ensure",
    "hook",
    "match_expression",
    "posts",
]

log = logging.getLogger(__name__)

MUTATE_PATH: Final = "/webhooks/v1/pods/mutate"
VALIDATE_PATH: Final = "/webhooks/v1/pods/validate"
MUTATING_NAME: Final = "gpustack-worker-mutation"
VALIDATING_NAME: Final = "gpustack-worker-validation"


class WebhookSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the API server reaches the webhooks: a Service in front of the worker."""

    service: str | None = "gpustack-operator-worker"
    """None: the worker registers no configuration (someone else manages them)."""
    namespace: str = "gpustack-system"
    port: int = 31443
    timeout_s: int = 10


def posts(catalog: Catalog) -> dict[str, PostRoute]:
    """The two POST routes, answering from ``catalog``."""

    async def mutating(body: bytes) -> Response:
        return _respond(body, lambda pod: review.Decision(patch=mutate(pod, catalog)))

    async def validating(body: bytes) -> Response:
        return _respond(body, lambda pod: review.Decision(errors=validate(pod, catalog)))

    return {MUTATE_PATH: mutating, VALIDATE_PATH: validating}


def _respond(body: bytes, decide: Callable[[Pod], review.Decision]) -> Response:
    try:
        out = review.answer(body, decide)
    except review.BadReview as e:
        log.debug("refused a malformed AdmissionReview: %s", e)
        return Response(status=400, body=str(e)[:1024].encode())
    return Response(body=out, content_type="application/json")


def match_expression() -> str:
    """CEL: true for a Pod with a container that requests a key of our families.

    Requests alone are enough: the API server fills a Pod's missing requests from its limits
    when it decodes the body, before any admission, so every limit is also a request here.
    """
    bases = ", ".join(f"'{b}'" for b in sorted(BASES.values()))
    claims = (
        "has(c.resources) && has(c.resources.requests) && c.resources.requests.exists(k, "
        f"[{bases}].exists(b, k == b || k.startsWith(b + '.')))"
    )
    return (
        f"object.spec.containers.exists(c, {claims}) || (has(object.spec.initContainers) && "
        f"object.spec.initContainers.exists(c, {claims}))"
    )


_LABELS: Final = {
    "app.kubernetes.io/component": "worker",
    "app.kubernetes.io/part-of": "gpustack-operator",
}


def hook(
    name: str,
    path: str,
    settings: WebhookSettings,
    ca: bytes | None,
    rules: list[dict[str, Any]],
    *,
    failure_policy: str = "Fail",
    match_conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """One webhook of a configuration: the worker's Service at ``path`` (``caBundle`` only when
    ``ca``), AdmissionReview v1, no side effects, ``matchPolicy: Equivalent``."""
    service = {
        "namespace": settings.namespace, "name": settings.service, "path": path,
        "port": settings.port,
    }  # fmt: skip
    client: dict[str, Any] = {"service": service}
    if ca:
        client["caBundle"] = base64.b64encode(ca).decode()
    webhook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "timeoutSeconds": settings.timeout_s,
        "clientConfig": client,
        "rules": rules,
    }
    if match_conditions is not None:
        webhook["matchConditions"] = match_conditions
    return webhook


def configuration_of(kind: Resource, name: str, webhooks: list[dict[str, Any]]) -> dict[str, Any]:
    """A Mutating- or ValidatingWebhookConfiguration of the worker's (``kind`` says which)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind.kind,
        "metadata": {"name": name, "labels": dict(_LABELS)},
        "webhooks": webhooks,
    }


def _webhook(name: str, path: str, settings: WebhookSettings, ca: bytes | None) -> dict[str, Any]:
    """A Pod webhook: CREATE of Pods that ask for an accelerator family."""
    rules = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
              "resources": ["pods"], "scope": "Namespaced"}]  # fmt: skip
    matches = [{"name": "requests-an-accelerator-family", "expression": match_expression()}]
    return hook(name, path, settings, ca, rules, match_conditions=matches)


def configurations(settings: WebhookSettings, ca: bytes | None) -> dict[Resource, dict[str, Any]]:
    """The Mutating- and ValidatingWebhookConfiguration (``caBundle`` only when ``ca``)."""
    mutating = _webhook("pods.mutation.worker.gpustack.ai", MUTATE_PATH, settings, ca)
    mutating["reinvocationPolicy"] = "Never"
    validating = _webhook("pods.validation.worker.gpustack.ai", VALIDATE_PATH, settings, ca)
    return {
        MUTATING_WEBHOOKS: configuration_of(MUTATING_WEBHOOKS, MUTATING_NAME, [mutating]),
        VALIDATING_WEBHOOKS: configuration_of(VALIDATING_WEBHOOKS, VALIDATING_NAME, [validating]),
    }


async def ensure(api: KubeClient, settings: WebhookSettings, ca: bytes) -> None:
    """Apply both configurations (server-side apply, idempotent; the CA replaces any other).

    :raises controlplane.errors.ApiError: the API refused one.
    """
    for resource, body in configurations(settings, ca).items():
        await api.apply(Ref(resource=resource, name=body["metadata"]["name"]), body)
    log.info("webhook configurations applied (service %s/%s)", settings.namespace, settings.service)

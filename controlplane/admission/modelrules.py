"""The rules of ``ModelStoreBinding`` and ``ModelPrefetch`` writes: a validating webhook.

A ``ValidatingWebhookConfiguration`` (:data:`NAME`, ``failurePolicy: Fail``) sends every CREATE
and UPDATE of both kinds to ``POST`` :data:`PATH` on the worker. The rules (:func:`validate`,
pure; messages in the API server's field-error style):

- ModelStoreBinding: ``spec.storeRefs`` is immutable; ``spec.quota.bytes`` is a quantity and
  may only grow (removing it, no limit, is growing; adding one to a binding without is not);
  ``spec.allowPinned`` may only go from false to true (pins other prefetches made under it
  would otherwise be revoked behind their back);
- ModelPrefetch: ``spec.artifactRef`` and ``spec.bindingRef`` are immutable; ``placement``
  takes ``instanceTypes`` or ``nodeSelector``, not both; ``retention.ttlAfterLastUse`` is a
  positive Go duration.

The CRDs carry CEL rules for what CEL can say alone (``storeRefs`` immutable, the placement
choice); the webhook says all of it, with the figures, and also holds on an API server that
does not evaluate CEL. An UPDATE of an object being deleted is not checked (finalizers must be
removable whatever the spec says).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from controlplane.admission import review, webhooks
from controlplane.admission.webhooks import WebhookSettings
from controlplane.k8s.client import KubeClient
from controlplane.resources import GROUP, VALIDATING_WEBHOOKS, VERSION, Ref
from controlplane.stores.bindings import quota_bytes
from kit.serving import PostRoute, Response
from kit.values import InvalidValue, parse_duration

__all__ = ["NAME", "PATH", "configuration", "decide", "ensure", "posts", "validate"]

log = logging.getLogger(__name__)

NAME: Final = "gpustack-worker-model-rules"
PATH: Final = "/webhooks/v1/models/validate"
KINDS: Final = {"modelstorebindings": "ModelStoreBinding", "modelprefetches": "ModelPrefetch"}

Body = Mapping[str, Any]


def _spec(body: Body | None) -> Mapping[str, Any]:
    return (body or {}).get("spec") or {}


def validate(kind: str, new: Body, old: Body | None) -> list[str]:
    """Every rule the write breaks (``old`` None: a CREATE); empty when it is admissible."""
    if old is not None and (new.get("metadata") or {}).get("deletionTimestamp"):
        return []
    if kind == "ModelStoreBinding":
        return _binding(new, old)
    if kind == "ModelPrefetch":
        return _prefetch(new, old)
    return []


def _quota(body: Body) -> tuple[int | None, list[str]]:
    try:
        return quota_bytes(body), []
    except InvalidValue as e:
        raw = (_spec(body).get("quota") or {}).get("bytes")
        return None, [f"spec.quota.bytes: Invalid value: {raw!r}: {e}"]


def _binding(new: Body, old: Body | None) -> list[str]:
    quota, errors = _quota(new)
    if old is None:
        return errors
    if _names(_spec(new).get("storeRefs")) != _names(_spec(old).get("storeRefs")):
        errors.append("spec.storeRefs: Forbidden: storeRefs is immutable")
    before, bad = _quota(old)
    if not errors and not bad and _shrinks(before, quota):
        errors.append(
            f"spec.quota.bytes: Forbidden: the quota may only grow (it was {_text(before)}, "
            f"this asks for {_text(quota)})"
        )
    if _spec(old).get("allowPinned") is True and _spec(new).get("allowPinned") is not True:
        errors.append("spec.allowPinned: Forbidden: allowPinned may only go from false to true")
    return errors


def _shrinks(before: int | None, after: int | None) -> bool:
    if after is None:
        return False  # no limit is the most of all
    return before is None or after < before


def _text(quota: int | None) -> str:
    return "unlimited" if quota is None else f"{quota} bytes"


def _names(refs: Any) -> list[str]:
    return [str(r.get("name")) for r in refs or [] if isinstance(r, dict)]


def _prefetch(new: Body, old: Body | None) -> list[str]:
    spec = _spec(new)
    errors = []
    placement = spec.get("placement") or {}
    if placement.get("instanceTypes") is not None and placement.get("nodeSelector") is not None:
        errors.append(
            "spec.placement: Forbidden: placement takes instanceTypes or nodeSelector, not both"
        )
    ttl = (spec.get("retention") or {}).get("ttlAfterLastUse")
    if ttl is not None:
        try:
            positive = parse_duration(str(ttl)) > 0
        except (InvalidValue, ValueError):
            positive = False
        if not positive:
            errors.append(
                f"spec.retention.ttlAfterLastUse: Invalid value: {ttl!r}: "
                "must be a positive duration (e.g. 72h)"
            )
    if old is not None:
        errors += [
            f"spec.{ref}: Forbidden: {ref} is immutable"
            for ref in ("artifactRef", "bindingRef")
            if (spec.get(ref) or {}).get("name") != (_spec(old).get(ref) or {}).get("name")
        ]
    return errors


def _object(raw: msgspec.Raw, what: str) -> dict[str, Any] | None:
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise review.BadReview(f"request.{what} is not JSON: {e}") from e
    if value is not None and not isinstance(value, dict):
        raise review.BadReview(f"request.{what} is not an object")
    return value


def decide(body: bytes) -> dict[str, Any]:
    """The AdmissionReview answer. :raises review.BadReview: the body is no AdmissionReview v1."""
    req = review.request_of(body)
    kind = KINDS.get(req.resource.resource)
    errors: list[str] = []
    if kind and not req.sub_resource and req.operation in ("CREATE", "UPDATE"):
        old = _object(req.old_object, "oldObject") if req.operation == "UPDATE" else None
        errors = validate(kind, _object(req.object, "object") or {}, old)
    response = review.Response(uid=req.uid, allowed=not errors)
    if errors:
        response.status = review.refusal(422, "Invalid", errors)
    return review.answered(response)


def posts() -> dict[str, PostRoute]:
    async def rules(body: bytes) -> Response:
        try:
            answer = decide(body)
        except ValueError as e:
            return Response(status=400, body=str(e)[:1024].encode())
        return Response(body=msgspec.json.encode(answer), content_type="application/json")

    return {PATH: rules}


def configuration(settings: WebhookSettings, ca: bytes | None) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration (``caBundle`` only when ``ca``)."""
    rules = [{"operations": ["CREATE", "UPDATE"], "apiGroups": [GROUP], "apiVersions": [VERSION],
              "resources": sorted(KINDS), "scope": "Namespaced"}]  # fmt: skip
    hook = webhooks.hook("models.validation.worker.gpustack.ai", PATH, settings, ca, rules)
    return webhooks.configuration_of(VALIDATING_WEBHOOKS, NAME, [hook])


async def ensure(api: KubeClient, settings: WebhookSettings, ca: bytes) -> None:
    """Apply the configuration (server-side apply, idempotent)."""
    await api.apply(Ref(resource=VALIDATING_WEBHOOKS, name=NAME), configuration(settings, ca))

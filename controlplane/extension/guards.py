"""Status guards: who may write a ``NodeModelStore``'s or a ``ModelArtifact``'s status.

A ``ValidatingWebhookConfiguration`` (:data:`NAME`) sends every UPDATE of
``nodemodelstores/status`` and ``modelartifacts/status`` to ``POST`` :data:`PATH` on the worker:

- ``NodeModelStore`` status: the model-manager's ServiceAccount
  (``--model-manager-service-account``, in the worker's namespace) and the worker itself, which
  writes it from the model agents' bus reports on their behalf (they hold no RBAC);
- ``ModelArtifact`` status: the worker only (``only the worker writes a ModelArtifact's status``).

Anyone else is refused with a message naming who may. The worker learns its own user name at
start-up with a ``SelfSubjectReview`` and refuses to start without one (:func:`whoami`): a guard
that does not know the worker would lock the worker out. The decision is a pure function.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from controlplane import errors
from controlplane.admission import review, webhooks
from controlplane.admission.webhooks import WebhookSettings
from controlplane.k8s.client import KubeClient
from controlplane.resources import GROUP, VALIDATING_WEBHOOKS, VERSION, Ref
from kit.serving import PostRoute, Response

__all__ = ["NAME", "PATH", "Allowed", "configuration", "decide", "ensure", "posts", "whoami"]

log = logging.getLogger(__name__)

NAME: Final = "gpustack-worker-status-guards"
PATH: Final = "/webhooks/v1/status-guard"
SELF_REVIEW: Final = "/apis/authentication.k8s.io/v1/selfsubjectreviews"

Allowed = Mapping[str, frozenset[str]]
"""Resource plural → the user names that may write its status."""


def allowed_writers(
    worker: str, namespace: str, model_manager_sa: str
) -> dict[str, frozenset[str]]:
    model_manager = f"system:serviceaccount:{namespace}:{model_manager_sa}"
    return {
        "nodemodelstores": frozenset({model_manager, worker}),
        "modelartifacts": frozenset({worker}),
    }


def decide(body: bytes, allowed: Allowed) -> dict[str, Any]:
    """The AdmissionReview answer. :raises review.BadReview: the body is no AdmissionReview v1."""
    req = review.request_of(body)
    response = review.Response(uid=req.uid, allowed=True)
    writers = allowed.get(req.resource.resource)
    if req.sub_resource == "status" and writers is not None:
        user = req.user_info.username
        if user not in writers:
            who = " or ".join(sorted(writers))
            message = f"only {who} may write a {req.resource.resource} status, not {user}"
            response = review.Response(
                uid=req.uid, allowed=False, status=review.refusal(403, "Forbidden", [message])
            )
    return review.answered(response)


def posts(allowed: Allowed) -> dict[str, PostRoute]:
    async def guard(body: bytes) -> Response:
        try:
            answer = decide(body, allowed)
        except ValueError as e:
            return Response(status=400, body=str(e)[:1024].encode())
        return Response(body=msgspec.json.encode(answer), content_type="application/json")

    return {PATH: guard}


def _hook(resource: str, scope: str, settings: WebhookSettings, ca: bytes | None) -> dict[str, Any]:
    rules = [{"operations": ["UPDATE"], "apiGroups": [GROUP], "apiVersions": [VERSION],
              "resources": [f"{resource}/status"], "scope": scope}]  # fmt: skip
    return webhooks.hook(f"{resource}-status.guard.worker.gpustack.ai", PATH, settings, ca, rules)


def configuration(settings: WebhookSettings, ca: bytes | None) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration (``caBundle`` only when ``ca``)."""
    hooks = [
        _hook("nodemodelstores", "Cluster", settings, ca),
        _hook("modelartifacts", "Namespaced", settings, ca),
    ]
    return webhooks.configuration_of(VALIDATING_WEBHOOKS, NAME, hooks)


async def ensure(api: KubeClient, settings: WebhookSettings, ca: bytes) -> None:
    """Apply the configuration (server-side apply, idempotent)."""
    await api.apply(Ref(resource=VALIDATING_WEBHOOKS, name=NAME), configuration(settings, ca))


async def whoami(api: KubeClient) -> str:
    """The worker's own user name (SelfSubjectReview).

    :raises errors.ApiError: the API could not say (the worker must not start guards blind).
    """
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = await api.request("POST", SELF_REVIEW, body)
    name = str(((answer.get("status") or {}).get("userInfo") or {}).get("username") or "")
    if not name:
        raise errors.ServerError(0, "SelfSubjectReview named no user: cannot guard statuses")
    log.info("the worker runs as %s", name)
    return name

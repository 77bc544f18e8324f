"""The worker's access reviewer: TokenReview, then SubjectAccessReview, as kube-rbac-proxy does.

A scraper presents a bearer token (Prometheus: its ServiceAccount's). The API server says who
it belongs to (TokenReview, the API server's own audience), then whether that user may ``get``
the non-resource URL (SubjectAccessReview with ``nonResourceAttributes``), which RBAC grants
with a ClusterRole rule ``nonResourceURLs: ["/metrics"], verbs: [get]``. The worker is the only
component with Kubernetes rights (``create`` on both review resources), so it reviews for its
own endpoint and, through :mod:`bus.accessreviews`, for every agent's.

The request bodies and the reading of the answers are pure functions; :class:`KubeReviewer`
only sends them, bounded in time, and turns every failure into ``unavailable`` (fail closed).
The token is sent to the API server and nowhere else; it is never logged.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import anyio

from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.resources import SUBJECTACCESSREVIEWS, TOKENREVIEWS
from kit.access import ALLOWED, NO_TOKEN, Decision

__all__ = ["KubeReviewer", "access_decision", "access_review", "authenticated_user", "token_review"]

log = logging.getLogger(__name__)

TIMEOUT_S: Final = 4.0
"""Both reviews, retries included: under the agents' wait for the worker (5 s)."""


def token_review(token: str) -> dict[str, Any]:
    """A TokenReview for the API server's own audience (no ``spec.audiences``)."""
    return {"apiVersion": TOKENREVIEWS.api_version, "kind": "TokenReview", "spec": {"token": token}}


def authenticated_user(body: dict[str, Any]) -> dict[str, Any] | None:
    """``status.user`` of an answered TokenReview; None when the token was not accepted."""
    status = body.get("status") or {}
    user = status.get("user") or {}
    if not status.get("authenticated") or not user.get("username"):
        return None
    return dict(user)


def access_review(user: dict[str, Any], path: str) -> dict[str, Any]:
    """A SubjectAccessReview: may ``user`` (as TokenReview described it) GET ``path``?"""
    spec: dict[str, Any] = {
        "user": user["username"],
        "groups": list(user.get("groups") or []),
        "nonResourceAttributes": {"path": path, "verb": "get"},
    }
    if user.get("uid"):
        spec["uid"] = user["uid"]
    if user.get("extra"):
        spec["extra"] = user["extra"]
    return {"apiVersion": SUBJECTACCESSREVIEWS.api_version, "kind": "SubjectAccessReview",
            "spec": spec}  # fmt: skip


def access_decision(body: dict[str, Any], user: dict[str, Any], path: str) -> Decision:
    """Allowed, or forbidden with kube-rbac-proxy's kind of reason (who, which verb, what)."""
    status = body.get("status") or {}
    if status.get("allowed") and not status.get("denied"):
        return ALLOWED
    why = f": {status['reason']}" if status.get("reason") else ""
    return Decision("forbidden", f"Forbidden (user={user['username']}, verb=get, path={path}){why}")


class KubeReviewer:
    """The :class:`~kit.access.Authorizer` of the worker, asking its own API client."""

    def __init__(self, api: KubeClient, *, timeout_s: float = TIMEOUT_S) -> None:
        self._api = api
        self._timeout_s = timeout_s

    async def allowed(self, token: str | None, path: str) -> Decision:
        if token is None:
            return NO_TOKEN
        with anyio.move_on_after(self._timeout_s):
            try:
                return await self._review(token, path)
            except errors.ApiError as e:
                log.warning("access review of %s failed: %s", path, e)
                return Decision("unavailable", f"authorization unavailable: API {e.status}")
        log.warning("access review of %s took more than %.1fs", path, self._timeout_s)
        return Decision("unavailable", "authorization unavailable: the API did not answer")

    async def _review(self, token: str, path: str) -> Decision:
        reviewed = await self._api.request(
            "POST", TOKENREVIEWS.collection_path(), token_review(token)
        )
        user = authenticated_user(reviewed)
        if user is None:
            return Decision("unauthenticated", "Unauthorized: invalid bearer token")
        answer = await self._api.request(
            "POST", SUBJECTACCESSREVIEWS.collection_path(), access_review(user, path)
        )
        return access_decision(answer, user, path)

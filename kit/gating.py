"""Who may read an endpoint's routes: the bearer-token gate, CORS and the client certificate.

Every route except the kubelet probes (``/livez``, ``/readyz``: they carry no token) passes
the :class:`~kit.access.Authorizer` given to :func:`kit.serving.https_server` when ``auth`` is
``review`` (``--metrics-auth``): 401 without or with an invalid bearer token, 403 when its user
may not read the path, 503 when nobody could decide (fail closed), each with a one-line
plain-text reason. Decisions are cached per (token hash, path) by
:class:`~kit.access.CachedAuthorizer`. ``posts`` carry no authorization of the endpoint's own:
the worker's admission webhooks are POSTed by the API server, which authenticates the endpoint
by its certificate.

Invariants: the gate decides on the route's path, never the request's; a refusal never echoes
the token; ``review`` without an authorizer fails the start rather than serving openly; CORS
headers go only to an origin a pattern matches whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web

from kit.access import Authorizer, CachedAuthorizer, Decision, bearer_token
from kit.httpsettings import HttpsSettings
from kit.listening import Handler, Middleware, ServingFailed

__all__ = ["cors_for", "gate_for", "peer_certificate", "refusal"]


_CORS_METHODS: Final = "GET, POST, PUT, PATCH, DELETE, OPTIONS"


def cors_for(patterns: tuple[str, ...]) -> Middleware:
    """CORS for origins matching one of ``patterns`` (anchored: the whole origin must match)."""
    compiled = [re.compile(p) for p in patterns]

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        allowed = origin is not None and any(p.fullmatch(origin) for p in compiled)
        preflight = (
            request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
        )
        if preflight:
            response: web.StreamResponse = web.Response(status=204 if allowed else 403)
        else:
            response = await handler(request)
        if allowed and origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Credentials"] = "true"
            response.headers["Vary"] = "Origin"
            if preflight:
                response.headers["Access-Control-Allow-Methods"] = _CORS_METHODS
                response.headers["Access-Control-Allow-Headers"] = request.headers.get(
                    "Access-Control-Request-Headers", "Authorization, Content-Type"
                )
                response.headers["Access-Control-Max-Age"] = "600"
        return response

    return cors


def peer_certificate(request: web.Request) -> dict[str, Any] | None:
    """The client certificate TLS verified against ``client_ca`` (``ssl.getpeercert`` form);
    None when the client presented none."""
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    return cert or None


def gate_for(
    settings: HttpsSettings, authorizer: Authorizer | None
) -> Callable[[str, Handler], Handler]:
    """What protects one route: nothing under ``none``, else the cached authorizer (also for a
    caller's own ``handlers``, which :func:`kit.serving.https_server` does not gate).

    :raises ServingFailed: ``review`` without an authorizer.
    """
    if settings.auth == "none":
        return lambda path, handler: handler
    if authorizer is None:
        raise ServingFailed("--metrics-auth=review, but this service was given no authorizer")
    cached = CachedAuthorizer(authorizer)

    def protect(path: str, handler: Handler) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            token = bearer_token(request.headers.get("Authorization"))
            decision = await cached.allowed(token, path)  # the route's path, not the request's
            return await handler(request) if decision.allowed else refusal(decision)

        return handle

    return protect


def refusal(decision: Decision) -> web.Response:
    """401/403/503 with the decision's reason as one line of text (never the token)."""
    headers = {"WWW-Authenticate": "Bearer"} if decision.verdict == "unauthenticated" else None
    text = " ".join((decision.reason or decision.verdict).split())[:300] + "\n"
    return web.Response(status=decision.http_status, text=text, headers=headers)

"""The HTTPS endpoint every service exposes: ``/metrics``, ``/readyz``, ``/livez`` and extras.

Extras are GET ``routes`` and POST ``posts``; a POST body is read whole, up to ``max_body_bytes``
(413 beyond it), so a handler gets bytes and never a stream it could be stalled on.

One implementation for ``dm serve``, ``model-manager`` and ``worker`` so probes and scrapes
behave the same everywhere. Its parts live beside it in ``kit``: the settings and flags in
:mod:`kit.httpsettings`, the connection bounds and the bind in :mod:`kit.listening`, who may
read which route in :mod:`kit.gating`, the certificate in :mod:`kit.tls`. This module joins
them into :func:`https_server` (and the plain-HTTP :func:`http_metrics_server`) and turns a
:class:`Response` into aiohttp's.

Invariants: the server is an async context manager that is listening when ``__aenter__``
returns (``port`` is the bound port, also for port 0) and is closed, connections included,
within ``shutdown_timeout_s`` of leaving the block, even when cancelled. Importing it turns
off the ``<counter>_created`` series, so every process that serves ``/metrics`` has none.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)

from kit.access import Authorizer
from kit.gating import cors_for, gate_for
from kit.httpsettings import HttpsSettings
from kit.listening import LIMITS, Handler, Limits, Middleware, ServingFailed, runner_for, serve_tcp
from kit.tls import tls_context

__all__ = [
    "MAX_BODY_BYTES",
    "HttpsSettings",
    "PostRoute",
    "Response",
    "Route",
    "Server",
    "ServingFailed",
    "http_metrics_server",
    "https_server",
]

# No ``<counter>_created`` series on any endpoint: DCGM exporter has none, scrapers rarely use
# them, and they double the series of every counter and histogram (docs/metrics.md).
disable_created_metrics()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[], Awaitable[Response]]
PostRoute = Callable[[bytes], Awaitable[Response]]
"""Called with the request's body."""
MAX_BODY_BYTES = 3 * 1024 * 1024
"""The API server's own bound on a request body: no AdmissionReview it sends is larger."""


@dataclass
class Server:
    """What a running endpoint tells its owner."""

    host: str
    port: int
    certificate_pem: bytes = field(repr=False, default=b"")
    scheme: str = "https"

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}"


@asynccontextmanager
async def https_server(  # noqa: PLR0913 - keyword-only parts of one endpoint, each optional
    settings: HttpsSettings,
    *,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    live: Callable[[], bool] = lambda: True,
    routes: Mapping[str, Route] | None = None,
    authorizer: Authorizer | None = None,
    posts: Mapping[str, PostRoute] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    handlers: Mapping[str, Handler] | None = None,
    client_ca: bytes | None = None,
    middlewares: Sequence[Middleware] = (),
    limits: Limits = LIMITS,
) -> AsyncIterator[Server]:
    """Serve the endpoint until the block exits.

    ``authorizer`` decides for every route but the probes when ``settings.auth`` is
    ``review`` (wrapped in a decision cache, :func:`kit.gating.gate_for`); it is not consulted
    under ``none``. ``handlers`` are aiohttp handlers for every method of a path pattern
    (``/apis/{tail:.*}``), which authenticate and authorize by themselves (the aggregated
    extension API). ``client_ca``: client certificates are asked for (optional) and verified
    against it; a handler reads the verified one with :func:`kit.gating.peer_certificate`.

    :raises ServingFailed: when it cannot start, or ``review`` is asked for without an
        authorizer.
    """
    gate = gate_for(settings, authorizer)
    context, pem = _server_context(settings.cert_dir, client_ca)
    app = _application(settings, max_body_bytes, middlewares)
    app.router.add_get("/metrics", gate("/metrics", _metrics_handler(registry)))
    app.router.add_get("/readyz", _probe_handler(ready))  # never gated: kubelet sends no token
    app.router.add_get("/livez", _probe_handler(live))
    _add_extras(app.router, gate, routes or {}, posts or {}, handlers or {})
    runner = runner_for(app, limits)
    await runner.setup()
    try:
        port = await serve_tcp(runner, settings.bind_address, settings.port, context, limits=limits)
    except OSError as e:
        raise ServingFailed(
            f"cannot serve HTTPS on {settings.bind_address}:{settings.port}: {e.strerror or e}"
        ) from e
    try:
        yield Server(host=settings.bind_address, port=port, certificate_pem=pem)
    finally:
        with anyio.move_on_after(settings.shutdown_timeout_s, shield=True):
            await runner.cleanup()


def _server_context(cert_dir: str | None, client_ca: bytes | None) -> tuple[ssl.SSLContext, bytes]:
    """The endpoint's TLS context and certificate PEM; with ``client_ca``, client certificates
    are asked for (optional) and verified against it."""
    context, pem = tls_context(cert_dir)
    if client_ca:
        context.verify_mode = ssl.CERT_OPTIONAL
        try:
            context.load_verify_locations(cadata=client_ca.decode())
        except (ssl.SSLError, ValueError) as e:
            raise ServingFailed(f"cannot load the client CA bundle: {e}") from e
    return context, pem


def _application(
    settings: HttpsSettings, max_body_bytes: int, middlewares: Sequence[Middleware]
) -> web.Application:
    """The application with the caller's middlewares, CORS first when origins are set."""
    chain = list(middlewares)
    if settings.cors_allowed_origins is not None:
        chain.insert(0, cors_for(settings.cors_allowed_origins))
    return web.Application(client_max_size=max_body_bytes, middlewares=chain)


def _add_extras(
    router: web.UrlDispatcher,
    gate: Callable[[str, Handler], Handler],
    routes: Mapping[str, Route],
    posts: Mapping[str, PostRoute],
    handlers: Mapping[str, Handler],
) -> None:
    """The caller's GET ``routes`` (gated), ``posts`` and own ``handlers`` (neither gated)."""
    for path, route in routes.items():
        router.add_get(path, gate(path, _route_handler(route)))
    # POST routes (the admission webhooks) are never gated: the API server calls them over TLS
    # with no bearer token, and AdmissionReview carries its own authorization.
    for path, post in posts.items():
        router.add_post(path, _post_handler(post))
    for path, handler in handlers.items():
        router.add_route("*", path, handler)


@asynccontextmanager
async def http_metrics_server(
    bind_address: str, port: int, registry: CollectorRegistry, *, shutdown_timeout_s: float = 2.0
) -> AsyncIterator[Server]:
    """``/metrics`` alone, over plain HTTP and to anyone (``dm serve --metrics-port``): for
    scrapers that expect DCGM exporter's convention. Nothing else is served on it.

    :raises ServingFailed: the port cannot be bound.
    """
    app = web.Application()
    app.router.add_get("/metrics", _metrics_handler(registry))
    runner = runner_for(app)
    await runner.setup()
    try:
        bound = await serve_tcp(runner, bind_address, port)
    except OSError as e:
        raise ServingFailed(f"cannot serve HTTP on {bind_address}:{port}: {e.strerror or e}") from e
    try:
        yield Server(host=bind_address, port=bound, scheme="http")
    finally:
        with anyio.move_on_after(shutdown_timeout_s, shield=True):
            await runner.cleanup()


def _metrics_handler(
    registry: CollectorRegistry,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle


def _probe_handler(check: Callable[[], bool]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        ok = check()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "not ready\n")

    return handle


def _route_handler(route: Route) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        response = await route()
        return web.Response(
            status=response.status,
            body=response.body,
            headers={"Content-Type": response.content_type},
        )

    return handle


def _post_handler(post: PostRoute) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()  # 413 (HTTPRequestEntityTooLarge) past client_max_size
        response = await post(body)
        return web.Response(
            status=response.status,
            body=response.body,
            headers={"Content-Type": response.content_type},
        )

    return handle

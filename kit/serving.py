"""The HTTPS endpoint every service exposes: ``/metrics``, ``/readyz``, ``/livez`` and extras.

Extras are GET ``routes`` and POST ``posts``; a POST body is read whole, up to ``max_body_bytes``
(413 beyond it), so a handler gets bytes and never a stream it could be stalled on. ``posts``
carry no authorization of the endpoint's own: the worker's admission webhooks are POSTed by the
API server, which authenticates the endpoint by its certificate.

One implementation for ``dm serve``, ``model-manager`` and ``worker`` so probes and scrapes
behave the same everywhere. TLS is always on: the certificate is ``tls.crt``/``tls.key`` from
``--cert-dir`` when given, else a self-signed one made at start-up (in memory, written to a
private temporary file only because :mod:`ssl` loads keys from files).

Every route except the kubelet probes (``/livez``, ``/readyz``: they carry no token) passes
the :class:`~kit.access.Authorizer` given to :func:`https_server` when ``auth`` is ``review``
(``--metrics-auth``): 401 without or with an invalid bearer token, 403 when its user may not
read the path, 503 when nobody could decide (fail closed), each with a one-line plain-text
reason. Decisions are cached per (token hash, path) by :class:`~kit.access.CachedAuthorizer`.

Every HTTP server the project runs (these, the dashboard, the gateway's socket) is built by
:func:`runner_for`, which bounds what one connection may hold and how long it may take
(:class:`Limits`): a client that sends its request head slowly (slowloris) or never, a TLS
handshake that never ends, or a body that trickles, is closed after a bound instead of holding a
connection and its buffers for an hour (aiohttp's idle default).

Invariants: the server is an async context manager that is listening when ``__aenter__``
returns (``port`` is the bound port, also for port 0) and is closed, connections included,
within ``shutdown_timeout_s`` of leaving the block, even when cancelled.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import re
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import anyio
import msgspec
from aiohttp import typedefs, web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)

from kit.access import Authorizer, CachedAuthorizer, Decision, bearer_token
from kit.options import Flags, SettingsError

# No ``<counter>_created`` series on any endpoint: DCGM exporter has none, scrapers rarely use
# them, and they double the series of every counter and histogram (docs/metrics.md).
disable_created_metrics()  # type: ignore[no-untyped-call]

Auth = Literal["review", "none"]
"""``review``: every route but the probes needs a bearer token the reviewer allows for its path;
``none``: anyone who reaches the address may read them."""


class ServingFailed(Exception):
    """The HTTPS endpoint could not start (port taken, unreadable certificate)."""


class HttpsSettings(msgspec.Struct, frozen=True, kw_only=True):
    bind_address: str = "0.0.0.0"
    port: int = 0
    """0 picks a free port (tests); services pass ``--secure-port``."""
    cert_dir: str | None = None
    """Directory holding ``tls.crt`` and ``tls.key``; None means self-signed."""
    shutdown_timeout_s: float = 2.0
    """Bound on closing connections when the block exits (inside the process runner's)."""
    auth: Auth = "review"
    """Who may read the routes other than the probes (``--metrics-auth``). Secure by default:
    a caller that forgets to pass an authorizer fails to start rather than serving openly."""
    cors_allowed_origins: tuple[str, ...] | None = None
    """Regular expressions, each matched against a request's whole ``Origin``: a match gets
    the CORS headers (and a preflight ``OPTIONS`` its 204), anything else none (preflight 403).
    None: no CORS handling at all (the agents)."""


class ServingFlags(Flags, frozen=True, kw_only=True):
    """The flags of a serving command's HTTPS endpoint."""

    bind_address: str
    secure_port: int
    cert_dir: str
    metrics_auth: str


def https_from(flags: ServingFlags) -> HttpsSettings:
    """``--bind-address``, ``--secure-port``, ``--cert-dir`` and ``--metrics-auth``.

    :raises SettingsError: the address is not an IP address, or the certificate directory
        lacks ``tls.crt`` or ``tls.key``, so the mistake is one line at start-up.
    """
    auth: Auth = "none" if flags.metrics_auth == "none" else "review"
    return https_at(flags.bind_address, flags.secure_port, flags.cert_dir, auth)


def https_at(address: str, port: int, cert_dir_text: str, auth: Auth) -> HttpsSettings:
    """The endpoint's settings from its parts (``standalone`` gives each component its port and
    no ``--metrics-auth``). :raises SettingsError: as :func:`https_from`."""
    return HttpsSettings(
        bind_address=bind_address(address),
        port=port,
        cert_dir=cert_dir(cert_dir_text or None),
        auth=auth,
    )


def bind_address(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError as e:
        raise SettingsError(f"--bind-address {text!r} is not an IP address") from e
    return text


def cert_dir(path: str | None) -> str | None:
    if path is None:
        return None
    missing = [name for name in ("tls.crt", "tls.key") if not os.path.isfile(Path(path, name))]
    if missing:
        raise SettingsError(f"--cert-dir {path}: no {' or '.join(missing)} there")
    return path


@dataclass(frozen=True)
class Limits:
    """What one connection may take of a server: time and memory.

    Memory per connection is bounded by the read buffer, the request head (``max_headers``
    fields of at most ``max_field_bytes``, a request line of ``max_line_bytes``) and the body
    (the application's ``client_max_size``): about 0.6 MiB for a head at the limits, plus the
    body. Time: ``header_timeout_s`` from the connection's start (or its previous response) to a
    whole request head, which also bounds an idle kept-alive connection and the TLS handshake;
    ``body_timeout_s`` to read a whole request body.
    """

    header_timeout_s: float = 15.0
    body_timeout_s: float = 30.0
    max_line_bytes: int = 8190
    max_field_bytes: int = 8190
    max_headers: int = 64
    read_buffer_bytes: int = 64 * 1024


LIMITS: Final = Limits()


def runner_for(app: web.Application, limits: Limits = LIMITS) -> web.AppRunner:
    """The runner of ``app`` with ``limits`` applied; ``app`` gets the body-timeout middleware
    (first, so every handler reads a body that already arrived whole)."""
    app.middlewares.insert(0, _body_within(limits.body_timeout_s))
    return web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        # A connection the client closed ends its handler, including one lingering to drain
        # the rest of a refused (413) body, which aiohttp would otherwise keep reading for ten
        # seconds past the connection's end, and past the server's.
        handler_cancellation=True,
        # aiohttp closes a connection whose handler waits for a request head once this passes
        # (since the connection started or the last response ended): the header timeout.
        keepalive_timeout=limits.header_timeout_s,
        max_line_size=limits.max_line_bytes,
        max_field_size=limits.max_field_bytes,
        max_headers=limits.max_headers,
        read_bufsize=limits.read_buffer_bytes,
    )


_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _body_within(timeout_s: float) -> Middleware:
    """Read a request's body, whole, within ``timeout_s`` (408 past it) before its handler
    runs; the handler's own ``read()``/``json()`` then returns the bytes already read."""

    @web.middleware
    async def body_within(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in _BODY_METHODS and request.body_exists:
            with anyio.move_on_after(timeout_s) as scope:
                await request.read()  # 413 past client_max_size, raised as aiohttp's error
            if scope.cancelled_caught:
                late = web.Response(status=408, text="request body not received in time\n")
                late.force_close()  # the rest of the body may still be on its way
                return late
        return await handler(request)

    return body_within


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[], Awaitable[Response]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = typedefs.Middleware
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
    ``review`` (wrapped in a decision cache here); it is not consulted under ``none``.
    ``handlers`` are aiohttp handlers for every method of a path pattern (``/apis/{tail:.*}``),
    which authenticate and authorize by themselves (the aggregated extension API).
    ``client_ca``: client certificates are asked for (optional) and verified against it; a
    handler reads the verified one with :func:`peer_certificate`.

    :raises ServingFailed: when it cannot start, or ``review`` is asked for without an
        authorizer.
    """
    gate = _gate(settings, authorizer)
    context, pem = _tls_context(settings.cert_dir)
    if client_ca:
        context.verify_mode = ssl.CERT_OPTIONAL
        try:
            context.load_verify_locations(cadata=client_ca.decode())
        except (ssl.SSLError, ValueError) as e:
            raise ServingFailed(f"cannot load the client CA bundle: {e}") from e
    chain = list(middlewares)
    if settings.cors_allowed_origins is not None:
        chain.insert(0, _cors(settings.cors_allowed_origins))
    app = web.Application(client_max_size=max_body_bytes, middlewares=chain)
    app.router.add_get("/metrics", gate("/metrics", _metrics_handler(registry)))
    app.router.add_get("/readyz", _probe_handler(ready))  # never gated: kubelet sends no token
    app.router.add_get("/livez", _probe_handler(live))
    for path, route in (routes or {}).items():
        app.router.add_get(path, gate(path, _route_handler(route)))
    # POST routes (the admission webhooks) are never gated: the API server calls them over TLS
    # with no bearer token, and AdmissionReview carries its own authorization.
    for path, post in (posts or {}).items():
        app.router.add_post(path, _post_handler(post))
    for path, handler in (handlers or {}).items():
        app.router.add_route("*", path, handler)
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


async def start_site(runner: web.AppRunner, site: web.BaseSite) -> None:
    """Start ``site``, shielded: the bind is local and quick, and asyncio's ``create_server``,
    cancelled at its last step, drops a server whose listening socket stays bound and
    registered with the loop until the loop closes. A cancellation that arrives meanwhile is
    delivered at the caller's next checkpoint, where its cleanup (``runner.cleanup()``) runs.

    :raises OSError: the bind failed; the runner is cleaned up.
    """
    try:
        with anyio.CancelScope(shield=True):
            await site.start()
    except OSError:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
        raise


async def serve_tcp(
    runner: web.AppRunner,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    *,
    limits: Limits = LIMITS,
) -> int:
    """Serve ``runner`` on ``host:port`` (an IP address; port 0: any); returns the bound port.

    The socket is bound and listening before the loop sees it. Given an address, uvloop binds,
    then reports a failed ``listen`` (a process that bound the port at the same moment listened
    first) to its exception handler and returns a server without a socket, which aiohttp trips
    on (``AttributeError``); here either step fails as the ``OSError`` it is.

    :raises OSError: the address cannot be bound or listened on; the runner is cleaned up.
    """
    try:
        sock = _listening(host, port)
    except OSError:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
        raise
    try:
        site = _Site(
            runner, sock, ssl_context=ssl_context, handshake_timeout_s=limits.header_timeout_s
        )
        await start_site(runner, site)
    except BaseException:
        sock.close()  # the server that would own it was never made
        raise
    return int(sock.getsockname()[1])


class _Site(web.SockSite):
    """aiohttp's socket site with the TLS handshake bounded by the header timeout (asyncio's
    own bound is a minute, which aiohttp does not let a caller change)."""

    def __init__(
        self,
        runner: web.AppRunner,
        sock: socket.socket,
        *,
        ssl_context: ssl.SSLContext | None,
        handshake_timeout_s: float,
    ) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context)
        self._handshake_timeout_s = handshake_timeout_s

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            server,
            sock=self._sock,
            ssl=self._ssl_context,
            backlog=self._backlog,
            # asyncio refuses a handshake timeout without TLS
            ssl_handshake_timeout=self._handshake_timeout_s if self._ssl_context else None,
        )


def _listening(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # "::" is IPv6 only, as the loop's own servers are
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


_CORS_METHODS: Final = "GET, POST, PUT, PATCH, DELETE, OPTIONS"


def _cors(patterns: tuple[str, ...]) -> Middleware:
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
    """What protects one route: nothing under ``none``, else the cached authorizer (for a
    caller's own ``handlers``, which :func:`https_server` does not gate).

    :raises ServingFailed: ``review`` without an authorizer.
    """
    return _gate(settings, authorizer)


def _gate(
    settings: HttpsSettings, authorizer: Authorizer | None
) -> Callable[[str, Handler], Handler]:
    """What protects one route: nothing under ``none``, else the cached authorizer."""
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


def _tls_context(cert_dir: str | None) -> tuple[ssl.SSLContext, bytes]:
    """Load ``tls.crt``/``tls.key`` from ``cert_dir``, or make a self-signed pair."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir:
        cert, key = Path(cert_dir, "tls.crt"), Path(cert_dir, "tls.key")
        try:
            context.load_cert_chain(cert, key)
            return context, cert.read_bytes()
        except (OSError, ssl.SSLError) as e:
            raise ServingFailed(f"cannot load {cert} and {key}: {e}") from e
    cert_pem, key_pem = self_signed_certificate(socket.gethostname())
    with tempfile.TemporaryDirectory(prefix="gpustack-tls-") as directory:
        cert, key = Path(directory, "tls.crt"), Path(directory, "tls.key")
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        context.load_cert_chain(cert, key)
    return context, cert_pem


def self_signed_certificate(hostname: str) -> tuple[bytes, bytes]:
    """Return (certificate PEM, key PEM) valid a year for ``hostname``, localhost and loopback."""
    from cryptography import x509  # imported here: only services without --cert-dir need it
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname[:64] or "localhost")])
    now = dt.datetime.now(dt.UTC)
    alt_names: list[x509.GeneralName] = [
        x509.DNSName(hostname or "localhost"),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(int.from_bytes(os.urandom(16), "big") >> 1)
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem

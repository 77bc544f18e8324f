"""How every HTTP server the project runs listens, and what one connection may take of it.

Every server (the HTTPS endpoints of :mod:`kit.serving`, the dashboard, the gateway's socket, a
model agent's peer server) is built by :func:`runner_for` and bound by :func:`serve_tcp`. The
runner bounds what one connection may hold and how long it may take (:class:`Limits`): a client
that sends its request head slowly (slowloris) or never, a TLS handshake that never ends, or a
body that trickles, is closed after a bound instead of holding a connection and its buffers for
an hour (aiohttp's idle default).

Invariants: a request body is read whole, within ``body_timeout_s`` (408 past it), before its
handler runs, so a handler gets bytes and never a stream it could be stalled on;
:func:`serve_tcp` returns with the socket bound and listening, or raises ``OSError`` with the
runner cleaned up and no socket left open, also when cancelled during the start.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import anyio
from aiohttp import typedefs, web

__all__ = [
    "LIMITS",
    "Handler",
    "Limits",
    "Middleware",
    "ServingFailed",
    "runner_for",
    "serve_tcp",
    "start_site",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = typedefs.Middleware


class ServingFailed(Exception):
    """The HTTPS endpoint could not start (port taken, unreadable certificate)."""


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

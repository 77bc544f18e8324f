"""The gateway's endpoint: probes, metrics and the API, on a unix socket or an HTTPS port.

- On a unix socket (``--bind-unix-path``, how a GPUStack server runs it): **HTTPS** with a
  self-signed certificate made at start-up (the server's client verifies nothing and names
  ``localhost``); the socket file mode 0600, so only the same user reaches it; a stale socket
  left by a killed gateway is replaced, anything else at the path is refused; the socket is
  removed on exit.
- Over HTTPS on ``--bind-address:--secure-port`` through :func:`kit.serving.https_server`, where
  ``--metrics-auth`` gates everything but the probes.

Routes: ``/livez``, ``/readyz``, ``/metrics`` and the API (:mod:`controlplane.gateway.api`).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import stat
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress

import anyio
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from kit.access import Authorizer
from kit.gating import gate_for
from kit.httpsettings import HttpsSettings
from kit.listening import Handler, ServingFailed, runner_for, start_site
from kit.serving import https_server
from kit.tls import self_signed_certificate

__all__ = ["serve", "socket_tls"]

log = logging.getLogger(__name__)


def socket_tls() -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate (kept in memory only)."""
    cert_pem, key_pem = self_signed_certificate(socket.gethostname())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # load_cert_chain reads files only: a private temporary directory holds them for the call.
    with tempfile.TemporaryDirectory(prefix="gpustack-gateway-") as directory:
        cert, key = os.path.join(directory, "tls.crt"), os.path.join(directory, "tls.key")
        with open(cert, "wb") as f:
            f.write(cert_pem)
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(key_pem)
        context.load_cert_chain(cert, key)
    return context


@asynccontextmanager
async def serve(
    *,
    unix_path: str | None,
    https: HttpsSettings,
    routes: Mapping[str, Handler],
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    authorizer: Authorizer | None,
) -> AsyncIterator[str]:
    """Serve until the block exits; yields where (``unix:/path`` or the HTTPS URL)."""
    if unix_path is None:
        gate = gate_for(https, authorizer)
        gated = {path: gate(path, handler) for path, handler in routes.items()}
        async with https_server(
            https, registry=registry, ready=ready, handlers=gated, authorizer=authorizer
        ) as server:
            yield server.url
        return
    async with _unix(unix_path, routes, registry, ready, https.shutdown_timeout_s):
        yield f"unix:{unix_path}"


@asynccontextmanager
async def _unix(
    path: str,
    routes: Mapping[str, Handler],
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    shutdown_timeout_s: float,
) -> AsyncIterator[None]:
    app = web.Application(client_max_size=64 * 1024)

    async def probe(_: web.Request) -> web.Response:
        return (
            web.Response(text="ok\n") if ready() else web.Response(status=503, text="not ready\n")
        )

    async def live(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def metrics(_: web.Request) -> web.Response:
        body = await anyio.to_thread.run_sync(generate_latest, registry)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app.router.add_get("/readyz", probe)
    app.router.add_get("/livez", live)
    app.router.add_get("/metrics", metrics)
    for route, handler in routes.items():
        app.router.add_route("*", route, handler)
    _clear_stale(path)
    runner = runner_for(app)
    await runner.setup()
    try:
        await start_site(runner, web.UnixSite(runner, path, ssl_context=socket_tls()))
    except OSError as e:
        raise ServingFailed(f"cannot serve on {path}: {e.strerror or e}") from e
    try:
        os.chmod(path, 0o600)
    except OSError as e:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
        raise ServingFailed(f"cannot serve on {path}: {e.strerror or e}") from e
    try:
        yield
    finally:
        with anyio.move_on_after(shutdown_timeout_s, shield=True):
            await runner.cleanup()
        with suppress(FileNotFoundError):
            os.unlink(path)


def _clear_stale(path: str) -> None:
    """Remove a socket a killed gateway left; refuse to replace anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ServingFailed(f"cannot serve on {path}: it exists and is not a socket")
    os.unlink(path)

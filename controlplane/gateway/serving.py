"""The gateway's HTTP surface: probes, metrics, and the aggregated list, item and watch.

Two ways to serve the same handlers:

- on a unix socket (``--bind-unix-path``, the default beside the worker): plain HTTP, the socket
  file mode 0600 so only the Pod's own containers (same user) reach it; a stale socket left by a
  killed gateway is replaced, anything else at the path is refused; the socket is removed on exit;
- over HTTPS on ``--bind-address:--secure-port`` through :func:`kit.serving.https_server`, where
  ``--metrics-auth`` gates everything but the probes.

Routes: ``/livez``, ``/readyz`` (ready after the first gather round), ``/metrics``,
``GET /apis/worker.gpustack.ai/v1alpha1/aggregatedinstancetypes`` (a list; ``?watch=true`` streams
``{"type", "object"}`` lines: ADDED for what exists, then every change), and ``…/{name}``.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, Final

import anyio
import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from controlplane.gateway.catalog import Catalog
from controlplane.resources import GROUP, VERSION
from kit.access import Authorizer
from kit.serving import (
    Handler,
    HttpsSettings,
    ServingFailed,
    gate_for,
    https_server,
    runner_for,
    start_site,
)

__all__ = ["COLLECTION", "handlers", "serve"]

log = logging.getLogger(__name__)

COLLECTION: Final = f"/apis/{GROUP}/{VERSION}/aggregatedinstancetypes"
_JSON: Final = "application/json"
_TRUE: Final = ("true", "1")


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(body), content_type=_JSON)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
            "message": message, "code": code}  # fmt: skip
    return _json(code, body)


def handlers(catalog: Catalog) -> dict[str, Handler]:
    """The request-aware routes, shared by both ways of serving."""

    async def collection(request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return _status(405, "MethodNotAllowed", "the aggregate is read-only")
        watch = request.query.get("watch", "").lower()
        if watch and watch not in (*_TRUE, "false", "0"):
            return _status(400, "BadRequest", f"watch={watch[:20]!r}: true or false")
        if watch in _TRUE:
            return await _watch(request, catalog)
        return _json(200, catalog.as_list())

    async def item(request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            return _status(405, "MethodNotAllowed", "the aggregate is read-only")
        name = request.match_info["name"]
        obj = catalog.objects.get(name)
        if obj is None:
            return _status(404, "NotFound", f'aggregatedinstancetypes "{name[:253]}" not found')
        return _json(200, obj)

    return {COLLECTION: collection, COLLECTION + "/{name}": item}


async def _watch(request: web.Request, catalog: Catalog) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": _JSON})
    await response.prepare(request)
    async with catalog.watch() as events:
        initial = [("ADDED", obj) for _, obj in sorted(catalog.objects.items())]
        for kind, obj in initial:
            await response.write(msgspec.json.encode({"type": kind, "object": obj}) + b"\n")
        async for kind, obj in events:
            await response.write(msgspec.json.encode({"type": kind, "object": obj}) + b"\n")
    return response


@asynccontextmanager
async def serve(
    *,
    unix_path: str | None,
    https: HttpsSettings,
    catalog: Catalog,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    authorizer: Authorizer | None,
) -> AsyncIterator[str]:
    """Serve until the block exits; yields where (``unix:/path`` or the HTTPS URL)."""
    routes = handlers(catalog)
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
    app = web.Application()

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
        await start_site(runner, web.UnixSite(runner, path))
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

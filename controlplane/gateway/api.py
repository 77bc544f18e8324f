"""The gateway's API under ``/apis``, as a GPUStack server calls it.

- ``POST /apis/workers?cluster=<id>&token=<token>[&force=true][&gvk=g/v/K ...]``, or the same in
  a JSON body (``clusters``, ``token``, ``gvks``): subscribe; 400 without a cluster or with a
  malformed gvk, an empty 200 otherwise (also for a repeat, which changes nothing);
- ``DELETE /apis/workers?cluster=<id>``: unsubscribe (200 whether or not it was subscribed);
- ``GET /apis/<plural>`` for the seven Instance-side kinds, with repeated ``cluster`` (none: every
  subscribed cluster), ``namespace`` (namespaced kinds), ``aggregated=true`` (instancetypes,
  instancetypeflavors) and ``watch=true``: ``{"items": [...]}``, or newline-delimited
  ``{"type", "cluster", "object"}`` events, starting with ``ADDED`` for what exists; a cluster
  that went away is one ``DELETED`` with ``object: null``. An aggregated watch sends
  ``{"type", "object"}`` changes of the aggregate.

Errors are ``{"code", "reason", "message"}``, one line of text, never a traceback.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import anyio
import msgspec
from aiohttp import web

from controlplane.gateway import aggregation, kinds
from controlplane.gateway.hub import Event, Hub
from controlplane.gateway.kinds import Kind
from controlplane.gateway.subscriptions import Manager
from kit.listening import Handler

__all__ = ["READ_PLURALS", "handlers"]

log = logging.getLogger(__name__)

READ_PLURALS: Final = (
    "instancetypeflavors", "instancetypes", "instances", "instancepersistentvolumetypes",
    "instancepersistentvolumes", "instanceimagepullsecrets", "instancesshpublickeys",
)  # fmt: skip
_AGGREGATES: Final = {
    "instancetypes": aggregation.aggregate_instance_types,
    "instancetypeflavors": aggregation.aggregate_flavors,
}
_TRUE: Final = ("true", "1", "t", "True", "TRUE")
_BOOLS: Final = (*_TRUE, "false", "0", "f", "False", "FALSE", "")
MAX_BODY: Final = 64 * 1024
CLUSTER_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
"""A cluster id becomes one segment of the proxy path: nothing that could leave it."""


def _error(code: int, reason: str, message: str) -> web.Response:
    body = msgspec.json.encode({"code": code, "reason": reason, "message": message})
    return web.Response(status=code, body=body, content_type="application/json")


class _BadRequest(Exception):
    pass


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "")
    if value not in _BOOLS:
        raise _BadRequest(f"{name}={value[:20]!r}: true or false")
    return value in _TRUE


class SubscribeBody(msgspec.Struct, forbid_unknown_fields=False):
    """The JSON body of ``POST /apis/workers``; each field adds to its query counterpart."""

    clusters: list[str] | str = []
    token: str = ""
    gvks: list[str] = []


class Subscription(msgspec.Struct, frozen=True):
    clusters: list[str]
    token: str
    gvks: list[str]
    force: bool


def _subscription(request: web.Request, raw: bytes) -> Subscription:
    body = SubscribeBody()
    if raw.strip():
        try:
            body = msgspec.json.decode(raw, type=SubscribeBody)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise _BadRequest(f"the body: {e}") from e
    named = [body.clusters] if isinstance(body.clusters, str) else body.clusters
    clusters = [c for c in request.query.getall("cluster", []) + named if c]
    return Subscription(
        clusters=clusters,
        token=request.query.get("token") or body.token,
        gvks=request.query.getall("gvk", []) + body.gvks,
        force=_flag(request.query, "force"),
    )


def handlers(manager: Manager, hub: Hub) -> dict[str, Handler]:
    return {"/apis/workers": _workers(manager), "/apis/{plural}": _collection(manager, hub)}


def _workers(manager: Manager) -> Handler:
    async def workers(request: web.Request) -> web.StreamResponse:
        if request.method not in ("POST", "DELETE"):
            return _error(405, "MethodNotAllowed", "POST or DELETE")
        # read(), not content.read(): the servers' body middleware (kit.listening.runner_for) has
        # already read the body whole (within its timeout and client_max_size), and the stream
        # it read is empty; read() hands back those bytes
        raw = await request.read()
        if len(raw) > MAX_BODY:
            return _error(413, "RequestEntityTooLarge", f"the body exceeds {MAX_BODY} bytes")
        try:
            asked = _subscription(request, raw)
            if not asked.clusters:
                raise _BadRequest("cluster is required")
            for cluster in asked.clusters:
                if not CLUSTER_ID.fullmatch(cluster):
                    raise _BadRequest(f"cluster {cluster[:60]!r}: letters, digits, '.', '_' "
                                      "and '-', at most 253, starting with a letter or digit")  # fmt: skip
            gvks = [kinds.parse_gvk(t) for t in asked.gvks]
        except (_BadRequest, kinds.BadGvk) as e:
            return _error(400, "BadRequest", str(e))
        for cluster in asked.clusters:
            if request.method == "POST":
                manager.subscribe(cluster, asked.token, gvks, force=asked.force)
            else:
                manager.unsubscribe(cluster)
        return web.Response(status=200)

    return workers


def _collection(manager: Manager, hub: Hub) -> Handler:
    async def collection(request: web.Request) -> web.StreamResponse:
        plural = request.match_info["plural"]
        if plural not in READ_PLURALS:
            return _error(404, "NotFound", f"no route /apis/{plural[:60]}")
        if request.method != "GET":
            return _error(405, "MethodNotAllowed", "GET only")
        kind = kinds.BY_PLURAL[plural]
        try:
            watch = _flag(request.query, "watch")
            aggregated = _flag(request.query, "aggregated")
        except _BadRequest as e:
            return _error(400, "BadRequest", str(e))
        if aggregated and plural not in _AGGREGATES:
            return _error(400, "BadRequest", f"{plural} has no aggregated view")
        clusters = [c for c in request.query.getall("cluster", []) if c]
        namespace = request.query.get("namespace") or None if kind.namespaced else None
        if watch:
            events = (
                _aggregated_events(manager, hub, kind, clusters)
                if aggregated
                else _events(manager, hub, kind, clusters, namespace)
            )
            return await _stream(request, events)
        held = await manager.read(kind, clusters, namespace)
        body = _AGGREGATES[plural](held) if aggregated else aggregation.tagged(held)
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    return collection


async def _stream(
    request: web.Request, events: AsyncIterator[dict[str, Any]]
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    async for event in events:
        await response.write(msgspec.json.encode(event) + b"\n")
    return response


def _wanted(event: Event, kind: Kind, clusters: list[str], namespace: str | None) -> bool:
    if event.plural not in (None, kind.plural) or (clusters and event.cluster not in clusters):
        return False
    meta = (event.object or {}).get("metadata") or {}
    return not namespace or event.object is None or meta.get("namespace") == namespace


async def _events(
    manager: Manager, hub: Hub, kind: Kind, clusters: list[str], namespace: str | None
) -> AsyncIterator[dict[str, Any]]:
    async with hub.watch() as stream:
        for cluster, objects in (await manager.read(kind, clusters, namespace)).items():
            for obj in objects:
                yield {"type": "ADDED", "cluster": cluster, "object": obj}
        async for event in stream:
            if _wanted(event, kind, clusters, namespace):
                yield {"type": event.type, "cluster": event.cluster, "object": event.object}


async def _aggregated_events(
    manager: Manager, hub: Hub, kind: Kind, clusters: list[str]
) -> AsyncIterator[dict[str, Any]]:
    fold = _AGGREGATES[kind.plural]

    async def current() -> dict[str, Any]:
        items = fold(await manager.read(kind, clusters, None))["items"]
        return {i["name"]: i for i in items}

    async with hub.watch() as stream:
        shown: dict[str, Any] = {}
        while True:
            now = await current()
            for type_, obj in aggregation.changes(shown, now):
                yield {"type": type_, "object": obj}
            shown = now
            try:
                event = await stream.receive()
                while not _wanted(event, kind, clusters, None):
                    event = await stream.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return

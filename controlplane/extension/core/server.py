"""The HTTP side of the core: discovery, OpenAPI and resource requests over aiohttp.

:class:`ApiServer` holds one :class:`~controlplane.extension.core.store.ObjectCache` per
resource and does only I/O around the pure decisions of the sibling modules: it reads the
provider into the cache (:meth:`ApiServer.sync`, before every read, and on every change a
watch is told of), answers lists, gets and watches from the cache, and hands the objects
:mod:`~controlplane.extension.core.writes` plans to the provider. Authentication and
authorization stay with the caller: :meth:`ApiServer.route` says what a request is (for a
SubjectAccessReview) before :meth:`ApiServer.serve` answers it.

Writes to one resource are serialized (a lock per resource), so the version check and the
store are one step in this process; across replicas the provider's own conditional store
(the Secret's resourceVersion, the bus key's revision) refuses the loser.

Watches: a JSON object per line, flushed each; ``timeoutSeconds`` (at most 30 min) ends the
stream; BOOKMARK events every ``bookmark_s`` when asked; a version that is too old (or newer
than this cache) ends the stream with an ``ERROR`` event carrying the 410 (or 504) Status.
An ``Accept`` asking for ``as=Table`` turns every list, get and watch event into a Table.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import msgspec
from aiohttp import web

from controlplane.extension.core import discovery, listing, openapi, writes
from controlplane.extension.core.failures import ApiFailure, not_found
from controlplane.extension.core.model import GroupVersion, Provider, ResourceSpec, Versioned
from controlplane.extension.core.routing import Route, route
from controlplane.extension.core.store import ObjectCache, now_rfc3339
from controlplane.extension.core.tables import Column, table

__all__ = ["ApiServer", "json_response", "wants_table"]

AGE: Final = Column(name="Age", type="date", json_path=".metadata.creationTimestamp",
                    description="time since creation")  # fmt: skip


def json_response(code: int, doc: Any, content_type: str = "application/json") -> web.Response:
    response = web.Response(status=code, body=json.dumps(doc).encode())
    response.headers["Content-Type"] = content_type
    return response


def wants_table(accept: str) -> bool:
    """Whether an ``Accept`` alternative is ``application/json;as=Table;g=meta.k8s.io``."""
    return any("as=Table" in a and "g=meta.k8s.io" in a for a in accept.split(","))


class _Served:
    def __init__(self, gv: GroupVersion, spec: ResourceSpec, provider: Provider) -> None:
        self.gv, self.spec, self.provider = gv, spec, provider
        self.cache = ObjectCache(f"{gv.group}/{spec.plural}")
        self.lock = anyio.Lock()


class ApiServer:
    """Serves ``groups``: each group version with a provider per resource plural."""

    def __init__(
        self,
        groups: Sequence[tuple[GroupVersion, Mapping[str, Provider]]],
        *,
        bookmark_s: float = 60.0,
    ) -> None:
        self.group_versions = [gv for gv, _ in groups]
        self._served = {
            (gv.group_version, r.plural): _Served(gv, r, providers[r.plural])
            for gv, providers in groups for r in gv.resources
        }  # fmt: skip
        self._bookmark_s = bookmark_s

    def route(self, path: str, method: str, query: Mapping[str, str]) -> Route | None:
        return route(self.group_versions, path, method, query)

    def cache(self, gv: GroupVersion, plural: str) -> ObjectCache:
        return self._served[(gv.group_version, plural)].cache

    def discovery(self, path: str, accept: str) -> web.Response:
        path = path.rstrip("/")
        if path == "/apis":
            if discovery.wants_v2(accept):
                return json_response(200, discovery.v2_list(self.group_versions), discovery.V2_TYPE)
            return json_response(200, discovery.api_group_list(self.group_versions))
        for gv in self.group_versions:
            if path == f"/apis/{gv.group}":
                return json_response(200, discovery.api_group(gv))
            if path == f"/apis/{gv.group_version}":
                return json_response(200, discovery.api_resource_list(gv))
        raise ApiFailure(404, "NotFound", f"{path} is not served here")

    def openapi(self, path: str, accept: str) -> web.Response:
        """``/openapi/v2`` (JSON only: 406 to a protobuf-only Accept), ``/openapi/v3`` and its
        per-group-version documents (with an ETag, immutable when asked by hash)."""
        if path == "/openapi/v2":
            if "json" not in accept and accept not in ("", "*/*"):
                raise ApiFailure(406, "NotAcceptable", "only application/json is served")
            return json_response(200, openapi.v2_document(self.group_versions))
        if path == "/openapi/v3":
            return json_response(200, openapi.v3_index(self.group_versions))
        for gv in self.group_versions:
            if path == f"/openapi/v3/apis/{gv.group_version}":
                body, digest = openapi.encoded(openapi.v3_document(gv))
                response = web.Response(status=200, body=body, content_type="application/json")
                response.headers["ETag"] = f'"{digest}"'
                response.headers["Cache-Control"] = "public, immutable"
                return response
        raise ApiFailure(404, "NotFound", f"{path} is not served here")

    async def sync(self, served: _Served, managed: dict[str, Any] | None = None) -> None:
        provider = served.provider
        objects = await provider.objects()
        version = provider.version() if isinstance(provider, Versioned) else None
        served.cache.sync(objects, managed, version)

    def allowed(self, r: Route) -> None:
        """:raises ApiFailure: 405, the resource does not serve the verb."""
        if r.verb not in r.resource.verbs:
            raise ApiFailure(405, "MethodNotAllowed", "the server does not allow this method on "
                             f"the requested resource ({r.resource.plural}: no {r.verb}; "
                             f"allowed: {', '.join(r.resource.verbs)})",
                             details={"group": r.gv.group, "kind": r.resource.plural,
                                      "name": r.name})  # fmt: skip

    async def serve(self, request: web.Request, r: Route, user: str) -> web.StreamResponse:
        self.allowed(r)
        served = self._served[(r.gv.group_version, r.resource.plural)]
        if r.verb in ("get", "list", "watch"):
            return await self._read(request, served, r)
        async with served.lock:
            await self.sync(served)
            if r.verb == "delete":
                return await self._delete(request, served, r, user)
            return await self._write(request, served, r, user)

    def _key(self, r: Route) -> str:
        return f"{r.namespace}/{r.name}" if r.resource.namespaced else r.name

    def _live(self, served: _Served, r: Route) -> dict[str, Any] | None:
        if r.resource.namespaced and not r.namespace:
            return None
        return served.cache.get(self._key(r))

    def _table(self, served: _Served, objects: list[dict[str, Any]], request: web.Request,
               meta: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        return table(objects, (*served.spec.columns, AGE), now=datetime.now(UTC), list_meta=meta,
                     include=request.query.get("includeObject", "Metadata"))  # fmt: skip

    async def _read(self, request: web.Request, served: _Served, r: Route) -> web.StreamResponse:
        as_table = wants_table(request.headers.get("Accept", ""))
        options = listing.parse_options(request.query, served.spec.allows_field)
        if r.namespace:
            options = msgspec.structs.replace(options, namespace=r.namespace)
        if r.verb == "watch":
            if r.name:
                options = listing.with_field(options, "metadata.name", r.name)
            return await self._watch(request, served, options, as_table)
        await self.sync(served)
        if r.verb == "get":
            live = self._live(served, r)
            if live is None:
                raise not_found(r.gv.group, r.resource.plural, r.name)
            if r.subresource:
                return json_response(200, await served.provider.subresource(r.subresource, live))
            return json_response(200, self._table(served, [live], request) if as_table else live)
        page = listing.list_page(served.cache, options)
        meta: dict[str, Any] = {"resourceVersion": page.resource_version}
        if page.continue_token:
            meta["continue"] = page.continue_token
        if page.remaining is not None:
            meta["remainingItemCount"] = page.remaining
        if as_table:
            return json_response(200, self._table(served, page.items, request, meta))
        return json_response(200, {"apiVersion": r.gv.group_version, "kind": f"{r.resource.kind}List",
                                   "metadata": meta, "items": page.items})  # fmt: skip

    async def _write(self, request: web.Request, served: _Served, r: Route,
                     user: str) -> web.Response:  # fmt: skip
        live = self._live(served, r)
        content_type = request.content_type
        creates = content_type == writes.APPLY and "create" in r.resource.verbs
        if live is None and (r.verb == "update" or (r.verb == "patch" and not creates)):
            raise not_found(r.gv.group, r.resource.plural, r.name)
        doc = writes.decode(await request.read(), content_type)
        if r.verb == "create":
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            name = str((meta or {}).get("name") or "")
            r = Route(gv=r.gv, resource=r.resource, verb="create", namespace=r.namespace,
                      name=name)  # fmt: skip
            if not name:
                raise ApiFailure(400, "BadRequest", "metadata.name: Required value")
            if self._live(served, r) is not None:
                raise ApiFailure(409, "AlreadyExists", f'{r.resource.plural}.{r.gv.group} '
                                 f'"{name}" already exists', details={"name": name,
                                 "group": r.gv.group, "kind": r.resource.plural})  # fmt: skip
        manager = request.query.get("fieldManager") or _manager(request.headers.get("User-Agent"))
        plan = writes.planned(r.gv, r.resource, live, doc, writes.Write(
            verb=r.verb, content_type=content_type, name=r.name, namespace=r.namespace,
            query=request.query, manager=manager, now=now_rfc3339(),
        ))  # fmt: skip
        if request.query.get("dryRun"):
            return json_response(200, plan.obj)
        warnings = [*plan.warnings, *await served.provider.write(live, plan.obj, user)]
        await self.sync(served, {self._key(r): plan.managed})
        stored = served.cache.get(self._key(r))
        response = json_response(201 if live is None else 200, stored or plan.obj)
        for text in warnings:
            response.headers.add("Warning", f'299 - "{text}"')
        return response

    async def _delete(self, request: web.Request, served: _Served, r: Route,
                      user: str) -> web.Response:  # fmt: skip
        live = self._live(served, r)
        if live is None:
            raise not_found(r.gv.group, r.resource.plural, r.name)
        body = await request.read()
        options = writes.decode(body, "application/json") if body else {}
        pre = (options.get("preconditions") if isinstance(options, dict) else None) or {}
        meta = live["metadata"]
        for field in ("resourceVersion", "uid"):
            if pre.get(field) not in (None, "", meta.get(field)):
                raise ApiFailure(409, "Conflict", f"Precondition failed: {field} in precondition: "
                                 f"{pre[field]}, {field} in object meta: {meta.get(field)}",
                                 details={"name": r.name, "group": r.gv.group,
                                          "kind": r.resource.plural})  # fmt: skip
        if not request.query.get("dryRun"):
            await served.provider.delete(live, user)
            await self.sync(served)
        return json_response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                   "status": "Success", "details": {
                                       "name": r.name, "group": r.gv.group,
                                       "kind": r.resource.plural, "uid": meta.get("uid")}})  # fmt: skip

    async def _watch(self, request: web.Request, served: _Served, options: listing.ListOptions,
                     as_table: bool) -> web.StreamResponse:  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        kind, api_version = served.spec.kind, served.gv.group_version

        async def send(kind_: str, obj: dict[str, Any]) -> None:
            if as_table and kind_ != "ERROR":
                meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
                obj = self._table(served, [] if kind_ == "BOOKMARK" else [obj], request, meta)
            await response.write(json.dumps({"type": kind_, "object": obj}).encode() + b"\n")

        with anyio.move_on_after(options.timeout_s):
            async with served.provider.changes() as changes, anyio.create_task_group() as tg:
                poke = _Poke()
                tg.start_soon(_pump, changes, poke)
                await self.sync(served)
                try:
                    start = listing.watch_start(served.cache, options)
                except ApiFailure as e:
                    await response.prepare(request)
                    await send("ERROR", e.status())
                    tg.cancel_scope.cancel()
                    return response
                await response.prepare(request)
                for obj in start.initial:
                    if options.matches(obj):
                        await send("ADDED", obj)
                if start.end_bookmark:
                    await send("BOOKMARK", listing.initial_events_end(kind, api_version, start.rv))
                await self._follow(served, options, start, poke, send, request)
                tg.cancel_scope.cancel()
        await response.write_eof()
        return response

    async def _follow(self, served: _Served, options: listing.ListOptions,
                      start: listing.WatchStart, poke: _Poke,
                      send: Any, request: web.Request) -> None:  # fmt: skip
        """Send events until the client goes (checked on every wake-up) or the time is up."""
        rv, pending = start.rv, start.replay
        while True:
            for event in pending:
                seen = listing.visible(event, options)
                if seen is not None:
                    await send(*seen)
                rv = max(rv, event.rv)
            woke = await _wait(poke, served.cache.changed, self._bookmark_s)
            if request.transport is None or request.transport.is_closing():
                return
            await self.sync(served)
            try:
                pending = served.cache.events_after(rv)
            except ApiFailure as e:
                await send("ERROR", e.status())
                return
            if not woke and not pending and options.bookmarks:
                await send("BOOKMARK", listing.bookmark(served.spec.kind,
                                                        served.gv.group_version, served.cache.rv))  # fmt: skip


class _Poke:
    """Set when the provider reports a change; replaced once a watch has woken on it."""

    def __init__(self) -> None:
        self.event = anyio.Event()


async def _pump(changes: AsyncIterator[object], poke: _Poke) -> None:
    async for _ in changes:
        poke.event.set()


async def _wait(poke: _Poke, changed: anyio.Event, timeout_s: float) -> bool:
    """Until the provider or the cache says something changed (True), or ``timeout_s`` (False)."""
    woke = False
    with anyio.move_on_after(timeout_s):
        async with anyio.create_task_group() as tg:

            async def wait(event: anyio.Event) -> None:
                nonlocal woke
                await event.wait()
                woke = True
                tg.cancel_scope.cancel()

            tg.start_soon(wait, poke.event)
            tg.start_soon(wait, changed)
    if poke.event.is_set():
        poke.event = anyio.Event()
    return woke


def _manager(agent: str | None) -> str:
    """The default field manager: the User-Agent's program name, as kube-apiserver derives it."""
    return (agent or "unknown").split("/")[0][:128] or "unknown"

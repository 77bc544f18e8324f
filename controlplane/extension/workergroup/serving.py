"""The HTTP surface of ``worker.gpustack.ai/v1``, answered from the mirrors (no API read).

Routes, under ``/apis/worker.gpustack.ai``: the ``APIGroup``; ``/v1``, the ``APIResourceList``,
which answers 503 until every mirror holds its first full state, so kube-apiserver's
availability check (a GET of it) turns the APIService ``Available`` only once the group really
serves; ``/v1[/namespaces/<ns>]/<resource>[/<name>[/progress]]``: get, list, watch, delete
(where the resource allows it) and the ``progress`` of a ModelArtifact. Authentication and
authorization are the extension API's (:mod:`controlplane.extension.auth`), by attributes of
this group.

Representations, by ``Accept``: the object (list) as JSON; a ``meta.k8s.io/v1`` ``Table`` (what
``kubectl get`` asks for; on a watch every event carries one, column definitions on the first);
``PartialObjectMetadata``/``PartialObjectMetadataList`` (the garbage collector's metadata
informers). A watch honours ``resourceVersion`` (410 ``Expired`` as an ``ERROR`` event when the
history no longer covers it), ``allowWatchBookmarks`` (a ``BOOKMARK`` every ``bookmark_s``),
``timeoutSeconds``, and ``sendInitialEvents=true`` (the initial state, then a bookmark annotated
``k8s.io/initial-events-end``), and turns a change that makes an object (un)match its selectors
into ``DELETED``/``ADDED``, as kube-apiserver does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import anyio
from aiohttp import web

from bus import events
from controlplane.extension.audit import INFO_KEY, RequestInfo
from controlplane.extension.auth import (
    ANONYMOUS,
    Attributes,
    Authenticator,
    AuthFailure,
    Authorizer,
    Unavailable,
    User,
)
from controlplane.extension.workergroup import catalog, listing, progress
from controlplane.extension.workergroup.catalog import RESOURCES, ResourceInfo
from controlplane.extension.workergroup.listing import Invalid, ListOptions
from controlplane.extension.workergroup.mirror import Key, Mirror
from kit.access import bearer_token
from kit.serving import Handler, peer_certificate

__all__ = ["WorkerGroupApi"]

log = logging.getLogger(__name__)

ROOT: Final = f"/apis/{catalog.GROUP}"
PREFIX: Final = f"{ROOT}/{catalog.VERSION}"
WATCH_TIMEOUT_S: Final = 1800
BOOKMARK_S: Final = 60.0
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"
_VERBS: Final = {"DELETE": "delete", "POST": "create", "PUT": "update", "PATCH": "patch"}

Deleter = Callable[[str, str, str], Awaitable[None]]
"""Deletes the stored object ``(resource, namespace, name)``; raises :class:`Invalid` (404...)."""
Downloads = Callable[[], Iterable[tuple[str, tuple[events.ModelState, ...] | None]]]


class Failure(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code}  # fmt: skip
    if details:
        out["details"] = details
    return out


def _json(code: int, doc: Mapping[str, Any]) -> web.Response:
    return web.Response(status=code, text=json.dumps(doc), content_type="application/json")


def representation(accept: str) -> str:
    """``Table``, ``PartialObjectMetadata`` or ``""`` (the objects), the first of ``accept``'s
    entries that is served here (protobuf entries are skipped: JSON only)."""
    for entry in accept.split(","):
        params = dict(
            (p.split("=", 1) + [""])[:2] for p in (x.strip() for x in entry.split(";")[1:])
        )
        media = entry.split(";")[0].strip()
        if media not in ("application/json", "*/*", "application/*"):
            continue
        as_ = params.get("as", "")
        if as_ == "Table":
            return "Table"
        if as_ in ("PartialObjectMetadata", "PartialObjectMetadataList"):
            return "PartialObjectMetadata"
        if not as_:
            return ""
    return ""


class Path_:
    """A parsed resource path."""

    def __init__(self, info: ResourceInfo, namespace: str, name: str, sub: str) -> None:
        self.info, self.namespace, self.name, self.sub = info, namespace, name, sub


def parse(path: str) -> Path_:
    """:raises Failure: 404 for anything not served."""
    parts = [p for p in path[len(PREFIX) :].split("/") if p]
    namespace = ""
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    if not parts or len(parts) > 3 or parts[0] not in RESOURCES:
        raise Failure(404, "NotFound", "the server could not find the requested resource")
    info = RESOURCES[parts[0]]
    if namespace and not info.namespaced:
        raise Failure(404, "NotFound", f"{info.name} are not namespaced")
    sub = parts[2] if len(parts) == 3 else ""
    if sub and sub not in info.subresources:
        raise Failure(404, "NotFound", f"{info.name} have no subresource {sub!r}")
    return Path_(info, namespace, parts[1] if len(parts) >= 2 else "", sub)


class WorkerGroupApi:
    """The group's handlers. ``mirrors``: resource -> its mirror; ``sync`` brings them up to date
    (cheap, no I/O); ``authenticator``/``authorizer`` None: ``--disable-auths``."""

    def __init__(
        self,
        *,
        mirrors: Mapping[str, Mirror],
        sync: Callable[[], None],
        downloads: Downloads,
        deleter: Deleter | None = None,
        bookmark_s: float = BOOKMARK_S,
    ) -> None:
        self._mirrors, self._sync = mirrors, sync
        self._auth: tuple[Authenticator | None, Authorizer | None] | None = None
        self._downloads, self._deleter = downloads, deleter
        self.bookmark_s = bookmark_s

    def secure(self, authenticator: Authenticator | None, authorizer: Authorizer | None) -> None:
        """Who may call (both None: ``--disable-auths``); until called every request is 503."""
        self._auth = (authenticator, authorizer)

    def served(self) -> bool:
        """True once every mirror holds its source's first full state."""
        self._sync()
        return all(m.ready for m in self._mirrors.values())

    def handlers(self) -> dict[str, Handler]:
        return {ROOT: self.handle, ROOT + "/{tail:.*}": self.handle}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        info = request[INFO_KEY] = RequestInfo()
        try:
            response = await self._handle(request, info)
        except Failure as e:
            response = _json(e.code, status(e.code, e.reason, str(e)))
        except Invalid as e:
            response = _json(e.code, status(e.code, e.reason, str(e)))
        info.code = response.status
        return response

    async def _handle(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        info.user = await self._authenticate(request)
        path = request.path.rstrip("/")
        if path in (ROOT, PREFIX):
            if request.method != "GET":
                raise Failure(405, "MethodNotAllowed", "discovery is read-only")
            if path == ROOT:
                return _json(200, catalog.api_group())
            if not self.served():
                raise Failure(503, "ServiceUnavailable", f"{catalog.GROUP_VERSION} is starting: "
                              "its caches have not listed yet")  # fmt: skip
            return _json(200, catalog.api_resource_list())
        if not path.startswith(PREFIX + "/"):
            raise Failure(404, "NotFound", "the server could not find the requested resource")
        where = parse(path)
        watch = request.query.get("watch", "") not in ("", "0", "false")
        verb = _VERBS.get(request.method) or (
            "get" if where.name else ("watch" if watch else "list")
        )
        attrs = info.attrs = Attributes(
            verb=verb, group=catalog.GROUP, version=catalog.VERSION, resource=where.info.name,
            namespace=where.namespace, name=where.name, subresource=where.sub,
        )  # fmt: skip
        allowed = ("get",) if where.sub else where.info.verbs
        if verb not in allowed:
            raise Failure(
                405,
                "MethodNotAllowed",
                f"{where.info.name}{'/' + where.sub if where.sub else ''}: no {verb}",
            )
        await self._authorize(info.user, attrs)
        if not self.served():
            raise Failure(
                503, "ServiceUnavailable", f"{where.info.name}: the cache has not listed yet"
            )
        return await self._serve(request, where, verb)

    async def _serve(self, request: web.Request, where: Path_, verb: str) -> web.StreamResponse:
        mirror = self._mirrors[where.info.name]
        if verb == "watch":
            return await self._watch(request, where, mirror)
        if verb == "list":
            return self._list(request, where, mirror)
        body = mirror.objects.get((where.namespace, where.name))
        if body is None:
            raise Failure(
                404, "NotFound", f'{where.info.name}.{catalog.GROUP} "{where.name}" not found'
            )
        if verb == "delete":
            if self._deleter is None:
                raise Failure(405, "MethodNotAllowed", f"{where.info.name}: no delete here")
            await self._deleter(where.info.name, where.namespace, where.name)
            return _json(200, body)
        if where.sub == "progress":
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            return _json(200, progress.progress(body, self._downloads(), now=now))
        return _json(200, self._shaped(request, where.info, [body], mirror, single=True))

    def _shaped(
        self,
        request: web.Request,
        info: ResourceInfo,
        items: list[dict[str, Any]],
        mirror: Mirror,
        *,
        single: bool,
        token: str | None = None,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(mirror.version)}
        if token:
            meta["continue"] = token
        shape = representation(request.headers.get("Accept", ""))
        if shape == "Table":
            return catalog.table(info, items, meta)
        if shape == "PartialObjectMetadata":
            partial = [_partial(b) for b in items]
            if single:
                return partial[0]
            return {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta, "items": partial}  # fmt: skip
        if single:
            return items[0]
        return {"kind": f"{info.kind}List", "apiVersion": catalog.GROUP_VERSION,
                "metadata": meta, "items": items}  # fmt: skip

    def _list(self, request: web.Request, where: Path_, mirror: Mirror) -> web.Response:
        opts = listing.options(request.query)
        _check_version(opts, mirror)
        scoped = _scoped(mirror.objects, where)
        items, token = listing.page(scoped, opts, opts.continued_at or mirror.version)
        return _json(
            200, self._shaped(request, where.info, items, mirror, single=False, token=token)
        )

    async def _watch(
        self, request: web.Request, where: Path_, mirror: Mirror
    ) -> web.StreamResponse:
        opts = listing.options({k: v for k, v in request.query.items() if k != "limit"})
        if where.name:  # /<resource>?watch=1&fieldSelector=metadata.name=<name> as a path
            opts = _with_name(opts, where.name)
        initial = request.query.get("sendInitialEvents", "") in ("true", "1")
        bookmarks = request.query.get("allowWatchBookmarks", "") in ("true", "1")
        if initial and not bookmarks:
            raise Failure(400, "BadRequest", "sendInitialEvents requires allowWatchBookmarks=true")
        timeout = _timeout(request.query.get("timeoutSeconds"))
        stream = _Stream(where, opts, mirror, representation(request.headers.get("Accept", "")))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        cursor = mirror.seq
        if opts.version is None or initial:
            for body in _scoped(mirror.objects, where).values():
                await stream.send(response, "ADDED", body)
            if initial:
                await stream.bookmark(response, end_of_initial=True)
        else:
            changes = mirror.since(opts.version)
            if changes is None:
                gone = status(
                    410, "Expired", f"too old resource version: {opts.version} ({mirror.version})"
                )
                await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                await response.write_eof()
                return response
            for change in changes:
                await stream.change(response, change.type, change.body)
        with anyio.move_on_after(timeout):
            while True:
                with anyio.move_on_after(self.bookmark_s) as idle:
                    await mirror.wait(cursor)
                self._sync()
                for change in mirror.after(cursor):
                    await stream.change(response, change.type, change.body)
                cursor = mirror.seq
                if idle.cancelled_caught and bookmarks:
                    await stream.bookmark(response)
        await response.write_eof()
        return response

    async def _authenticate(self, request: web.Request) -> User:
        if self._auth is None:
            raise Failure(503, "ServiceUnavailable", "the API is starting")
        authenticator = self._auth[0]
        if authenticator is None:
            return User(name=ANONYMOUS, groups=("system:unauthenticated",))
        token = bearer_token(request.headers.get("Authorization"))
        try:
            return await authenticator.authenticate(
                peer_certificate(request), request.headers, token
            )
        except AuthFailure as e:
            raise Failure(401, "Unauthorized", f"Unauthorized: {e}") from e

    async def _authorize(self, user: User, attrs: Attributes) -> None:
        authorizer = self._auth[1] if self._auth else None
        if authorizer is None:
            return
        try:
            allowed, reason = await authorizer.allowed(user, attrs)
        except Unavailable as e:
            raise Failure(503, "ServiceUnavailable", str(e)) from e
        if not allowed:
            resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
            what = resource + (f' "{attrs.name}"' if attrs.name else "")
            raise Failure(
                403, "Forbidden",
                f"{what} is forbidden: User {user.name!r} cannot {attrs.verb} resource "
                f"{resource!r} in API group {attrs.group!r}{': ' + reason if reason else ''}",
            )  # fmt: skip


class _Stream:
    """One watch's output: filters by scope and selectors, shapes each event."""

    def __init__(self, where: Path_, opts: ListOptions, mirror: Mirror, shape: str) -> None:
        self._where, self._opts, self._mirror, self._shape = where, opts, mirror, shape
        self._visible: set[Key] = {k for k, b in mirror.objects.items() if listing.match(opts, b)}
        """Keys this watcher last saw matching (a resumed watch: those matching at its start)."""
        self._headers = True

    def _in_scope(self, body: Mapping[str, Any]) -> bool:
        meta = body.get("metadata") or {}
        return not self._where.namespace or meta.get("namespace") == self._where.namespace

    async def change(self, response: web.StreamResponse, kind: str, body: dict[str, Any]) -> None:
        """One change, as this watcher sees it (an object leaving its selection is DELETED)."""
        if not self._in_scope(body):
            return
        if not self._opts.labels and not self._opts.fields:
            await self._write(response, kind, body)
            return
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name")))
        matches = kind != "DELETED" and listing.match(self._opts, body)
        was = key in self._visible
        if matches:
            await self.send(response, "MODIFIED" if was else "ADDED", body)
        elif was:
            self._visible.discard(key)
            await self._write(response, "DELETED", body)

    async def send(self, response: web.StreamResponse, kind: str, body: dict[str, Any]) -> None:
        if kind != "DELETED" and not listing.match(self._opts, body):
            return
        meta = body.get("metadata") or {}
        self._visible.add((str(meta.get("namespace") or ""), str(meta.get("name"))))
        await self._write(response, kind, body)

    async def bookmark(self, response: web.StreamResponse, *, end_of_initial: bool = False) -> None:
        meta: dict[str, Any] = {"resourceVersion": str(self._mirror.version)}
        if end_of_initial:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        kind = self._where.info.kind
        body = {"kind": kind, "apiVersion": catalog.GROUP_VERSION, "metadata": meta}
        line = {"type": "BOOKMARK", "object": body}
        await response.write(json.dumps(line).encode() + b"\n")

    async def _write(self, response: web.StreamResponse, kind: str, body: dict[str, Any]) -> None:
        obj: dict[str, Any] = body
        if self._shape == "Table":
            meta = {"resourceVersion": str((body.get("metadata") or {}).get("resourceVersion", ""))}
            obj = catalog.table(self._where.info, [body], meta, headers=self._headers)
            self._headers = False
        elif self._shape == "PartialObjectMetadata":
            obj = _partial(body)
        await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


def _partial(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": body.get("metadata") or {}}  # fmt: skip


def _scoped(objects: Mapping[Key, dict[str, Any]], where: Path_) -> dict[Key, dict[str, Any]]:
    if not where.namespace:
        return dict(objects)
    return {k: v for k, v in objects.items() if k[0] == where.namespace}


def _with_name(opts: ListOptions, name: str) -> ListOptions:
    import msgspec

    return msgspec.structs.replace(
        opts, fields=(*opts.fields, listing.Requirement("metadata.name", "=", (name,)))
    )


def _check_version(opts: ListOptions, mirror: Mirror) -> None:
    """A list at a version this memory state cannot answer: 410 (see :mod:`.listing`)."""
    if opts.continued_at is not None and mirror.since(opts.continued_at) is None:
        raise Invalid(410, "Expired", "The provided continue parameter is too old to display a "
                      "consistent list result. You can start a new list without the continue parameter.")  # fmt: skip
    if opts.version is None:
        return
    if opts.exact and opts.version != mirror.version:
        raise Invalid(410, "Expired", f"resourceVersion {opts.version} is not the current one "
                      f"({mirror.version}): only the current state is held")  # fmt: skip
    if opts.version > mirror.version:
        raise Invalid(504, "Timeout", f"Too large resource version: {opts.version}, "
                      f"current resource version: {mirror.version}")  # fmt: skip


def _timeout(text: str | None) -> float:
    try:
        value = float(text) if text else WATCH_TIMEOUT_S
    except ValueError:
        raise Failure(400, "BadRequest", f"timeoutSeconds {text!r} is not a number") from None
    return max(0.0, min(value, WATCH_TIMEOUT_S))


def with_group(group: WorkerGroupApi, handlers: Mapping[str, Handler]) -> dict[str, Handler]:
    """``handlers`` (the extension API's) with this group's routes first, and ``/apis``
    answering both groups: the other handler's ``APIGroupList`` with this group added."""
    inner = handlers.get("/apis")

    async def apis(request: web.Request) -> web.StreamResponse:
        assert inner is not None
        response = await inner(request)
        if (
            request.method != "GET"
            or response.status != 200
            or not isinstance(response, web.Response)
        ):
            return response
        doc = json.loads(response.text or "{}")
        if doc.get("kind") != "APIGroupList":
            return response
        group_doc = {
            k: v for k, v in catalog.api_group().items() if k not in ("kind", "apiVersion")
        }
        doc["groups"] = [*doc.get("groups", []), group_doc]
        return _json(200, doc)

    out = dict(group.handlers())
    out.update(handlers)
    if inner is not None:
        out["/apis"] = apis
    return out

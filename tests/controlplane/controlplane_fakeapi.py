"""A small stateful Kubernetes API fake over real HTTP (aiohttp), for the control plane's tests.

Why not kmock: kmock 0.8 registers a pytest plugin that imports ``pytest_asyncio`` (not a
dependency here: installing kmock breaks every test run of the repository), and its emulator has
no ``resourceVersion``, no optimistic concurrency (409 on a stale precondition), no create on
server-side apply and no status subresource, which are exactly what these tests must exercise.

What it does, like the real API server:

- any ``/api/v1/...`` or ``/apis/<g>/<v>/...`` collection or object path, namespaced or not;
- GET, LIST (``items``), POST (409 AlreadyExists), PUT and merge PATCH (409 when the body's
  ``metadata.resourceVersion`` is stale), server-side apply PATCH (creates when absent), DELETE;
- ``resourceVersion`` from one global counter, ``uid``, ``generation`` bumped on spec changes;
- the main resource ignores ``status``; the ``/status`` subresource changes only ``status``;
- watches: ``GET <collection>?watch=true`` streams ``{"type", "object"}`` JSON lines (ADDED for
  what exists first unless ``resourceVersion`` is given, then ADDED/MODIFIED/DELETED as they
  happen; ``timeoutSeconds`` ends the stream);
- TokenReview (``POST /apis/authentication.k8s.io/v1/tokenreviews``): :meth:`FakeApi.issue_token`
  mints a ServiceAccount token (pod-bound with its node, as kubelet gets them, or not); the
  review authenticates it only for an audience it was issued for and until it expires, like
  the API server, and no longer once :meth:`FakeApi.revoke` (its Pod deleted) was called;
- :meth:`FakeApi.fail_next` injects one error response for a method and path prefix;
- :meth:`FakeApi.hold` parks matching requests until the test releases them (cancellation tests);
- per-verb counters of successful writes (``writes``), every request per method and path
  (:attr:`FakeApi.paths`: what a client sent); :attr:`FakeApi.field_managers` records
  each server-side apply's ``fieldManager`` per object (ownership itself is not modelled);
- :attr:`FakeApi.validators` check objects of a collection before they are stored (422), and
  :attr:`FakeApi.absent` serves collections as not installed (404), e.g. Kueue's kinds;
- SelfSubjectReview answers :attr:`FakeApi.self_user`;
- paged lists: ``limit`` and ``continue`` (a token naming the list's resourceVersion and the last
  key served, objects in key order; an unknown token is a 400; unlike the API server, a later
  page shows the objects as they are now, not as they were at the list's resourceVersion: a
  watch from that resourceVersion replays the difference all the same);
- :meth:`FakeApi.compact` forgets history, so a continue token or a watch from an older
  resourceVersion gets a 410 (the watch as an ``ERROR`` event, as the API server sends it);
  :attr:`FakeApi.lists` counts list requests per collection; :meth:`FakeApi.end_watches` ends
  every open watch (as its timeout would);
- TokenReview and SubjectAccessReview (create only, nothing stored): :attr:`FakeApi.tokens` maps
  a token to the ``status.user`` it authenticates as, :attr:`FakeApi.grants` holds the
  ``(user or group, non-resource path)`` pairs RBAC would allow a ``get`` of,
  :attr:`FakeApi.resource_grants` the ``(user or group, verb, group, resource)`` ones, and
  :attr:`FakeApi.reviews` counts the reviews answered, per resource.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from aiohttp import web

Key = tuple[str, str | None, str]  # (collection id, namespace, name)
DEFAULT_AUDIENCE = "https://kubernetes.default.svc"
REVIEWS = {
    "apis/authentication.k8s.io/v1/tokenreviews": "TokenReview",
    "apis/authorization.k8s.io/v1/subjectaccessreviews": "SubjectAccessReview",
    "apis/authentication.k8s.io/v1/selfsubjectreviews": "SelfSubjectReview",
}


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def _clone(value: Any) -> Any:
    """A deep copy of a JSON document, through msgspec's JSON (about 5 times as fast as
    ``copy.deepcopy``, which took a fifth of a 500-node test's time); anything the round trip
    does not give back equal (a tuple, a datetime, a non-string key) or cannot encode is
    deep-copied instead."""
    try:
        again = _DECODER.decode(_ENCODER.encode(value))
    except (TypeError, msgspec.MsgspecError):
        return copy.deepcopy(value)
    return again if again == value else copy.deepcopy(value)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return _clone(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


def _split(path: str) -> tuple[str, str | None, str | None, str | None]:
    """``(collection id, namespace, name, subresource)`` of an API path."""
    parts = [p for p in path.split("/") if p]
    if parts[0] == "api":
        head, rest = parts[:2], parts[2:]
    else:
        head, rest = parts[:3], parts[3:]
    namespace = None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return "/".join([*head, plural]), namespace, name, sub


@dataclass
class Hold:
    """The first request matching ``method`` and ``prefix`` waits for :attr:`release`: before it
    is applied, or with ``after`` once applied but before it is answered (a lost answer)."""

    method: str
    prefix: str
    after: bool = False
    reached: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)


class FakeApi:
    """The store and the aiohttp handlers."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.writes: Counter[str] = Counter()
        self.object_writes: Counter[Key] = Counter()
        """Successful updates and patches per object (main resource and subresources)."""
        self.requests: Counter[str] = Counter()
        self.paths: Counter[tuple[str, str]] = Counter()
        """Every request (answered or refused) per ``(method, path)``: what a client sent."""
        self.watches = 0
        """Watch streams opened so far."""
        self.grants: set[tuple[str, str]] = set()
        """``(user or group, path)`` allowed to ``get`` a non-resource URL (SubjectAccessReview)."""
        self.reviews: Counter[str] = Counter()
        self.resource_grants: set[tuple[str, str, str, str]] = set()
        """``(user or group, verb, API group, resource)`` RBAC would allow (SubjectAccessReview
        with ``resourceAttributes``)."""
        self.access_reviews: list[dict[str, Any]] = []
        """The ``spec`` of every resource SubjectAccessReview answered."""
        self.self_user: dict[str, Any] = {
            "username": "system:serviceaccount:gpustack-system:gpustack-operator-worker",
            "groups": ["system:serviceaccounts", "system:authenticated"],
        }
        """Who the caller is, as a SelfSubjectReview answers (the worker's identity)."""
        self._rv = itertools.count(1)
        self._faults: list[tuple[str, str, int]] = []
        self._holds: list[Hold] = []
        self._log: list[tuple[int, str, str, dict[str, Any]]] = []
        self._changed = anyio.Event()
        self._closing = False
        self.tokens: dict[str, dict[str, Any]] = {}
        """Issued tokens: their audiences, expiry and the ``user`` a review answers."""
        self.validators: dict[str, Callable[[dict[str, Any]], str | None]] = {}
        """Collection id -> check of an object about to be stored (its message: a 422)."""
        self.absent: set[str] = set()
        """Collection id prefixes served as not installed (404), e.g. Kueue's before its CRDs."""
        self.lists: Counter[str] = Counter()
        """List requests (pages) per collection id."""
        self.reads: Counter[tuple[str, str]] = Counter()
        """GETs of one object per (collection id, name)."""
        self.compacted = 0
        """History before this resourceVersion is gone: older watches and continues get 410."""
        self._ends = 0
        self.field_managers: dict[Key, set[str]] = {}
        """The ``fieldManager`` of every server-side apply per object (forgotten on delete)."""

    def fail_next(self, method: str, path_prefix: str, status: int, times: int = 1) -> None:
        self._faults.extend([(method, path_prefix, status)] * times)

    def hold(self, method: str, path_prefix: str, *, after: bool = False) -> Hold:
        h = Hold(method, path_prefix, after)
        self._holds.append(h)
        return h

    def issue_token(
        self,
        namespace: str,
        service_account: str,
        *,
        node: str | None = None,
        audiences: tuple[str, ...] = ("gpustack-nats",),
        ttl_s: float = 3600.0,
    ) -> str:
        """A ServiceAccount token, bound to a Pod on ``node`` when given (a JWT in shape, with
        ``exp``; only this fake's reviews accept it)."""
        claims = {"exp": int(time.time() + ttl_s), "jti": str(uuid.uuid4()), "aud": audiences}
        body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
        token = f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"
        extra: dict[str, list[str]] = {}
        if node is not None:
            pod = f"{service_account}-{uuid.uuid4().hex[:5]}"
            extra = {
                "authentication.kubernetes.io/pod-name": [pod],
                "authentication.kubernetes.io/node-name": [node],
            }
        user = {
            "username": f"system:serviceaccount:{namespace}:{service_account}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            "extra": extra,
        }
        self.tokens[token] = {"audiences": list(audiences), "user": user, "exp": claims["exp"]}
        return token

    def revoke(self, token: str) -> None:
        """The token's Pod is gone: reviews no longer authenticate it."""
        self.tokens.pop(token, None)

    def user_token(self, token: str, user: dict[str, Any]) -> None:
        """A token the API server's default audience accepts as ``user`` for an hour."""
        audiences = [DEFAULT_AUDIENCE]
        self.tokens[token] = {"audiences": audiences, "user": user, "exp": time.time() + 3600}

    def _authenticate(self, spec: dict[str, Any]) -> dict[str, Any]:
        issued = self.tokens.get(spec.get("token", ""))
        if issued is not None and issued["exp"] <= time.time():
            issued = None  # expired: as good as unknown
        wanted = spec.get("audiences") or [DEFAULT_AUDIENCE]
        common = [a for a in wanted if issued and a in issued["audiences"]]
        status: dict[str, Any] = {"authenticated": False, "error": "invalid bearer token"}
        if issued is not None and common:
            status = {"authenticated": True, "user": issued["user"], "audiences": common}
        elif issued is not None:
            status["error"] = "token audiences are invalid for the target audiences"
        return status

    def get(self, collection: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.objects[(collection, namespace, name)]

    def put_object(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create an object directly (e.g. a Node the kubelet would register)."""
        meta = body.setdefault("metadata", {})
        self._stamp(body, new=True)
        self.objects[(collection, meta.get("namespace"), meta["name"])] = body
        self._notify(collection, "ADDED", body)
        return body

    def remove(self, collection: str, name: str, namespace: str | None = None) -> None:
        self._notify(collection, "DELETED", self.objects.pop((collection, namespace, name)))

    def _notify(self, collection: str, kind: str, body: dict[str, Any]) -> None:
        body = _clone(body)
        if kind == "DELETED":
            body["metadata"]["resourceVersion"] = str(next(self._rv))
        self._log.append((int(body["metadata"]["resourceVersion"]), collection, kind, body))
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def close_watches(self) -> None:
        """End every watch stream (the server is stopping)."""
        self._closing = True
        self._wake()

    def compact(self) -> None:
        """Forget the history up to now (etcd's compaction)."""
        self.compacted = int(self._log[-1][0]) if self._log else 0

    def end_watches(self) -> None:
        """End every open watch cleanly (as its ``timeoutSeconds`` would)."""
        self._ends += 1
        self._wake()

    def _stamp(self, body: dict[str, Any], *, new: bool) -> None:
        meta = body.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._rv))
        if new:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("generation", 1)
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests[request.method] += 1
        self.paths[(request.method, request.path)] += 1
        h = next(
            (h for h in self._holds if h.method == request.method
             and request.path.startswith(h.prefix)),
            None,
        )  # fmt: skip
        if h is not None:
            self._holds.remove(h)
            if not h.after:
                h.reached.set()
                await h.release.wait()
        response = await self._handle(request)
        if h is not None and h.after:
            h.reached.set()
            await h.release.wait()
        return response

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        for i, (method, prefix, status) in enumerate(self._faults):
            if method == request.method and request.path.startswith(prefix):
                del self._faults[i]
                return _status(status, "injected", headers={"Retry-After": "0"})
        coll, ns, name, sub = _split(request.path)
        if any(coll.startswith(a) for a in self.absent):
            return _status(404, f"the server could not find the requested resource ({coll})")
        body = await request.json() if request.can_read_body else None
        if coll in REVIEWS and request.method == "POST":
            return self._review(coll, body)
        if name is None:
            if request.method == "POST":
                return self._create(coll, ns, body)
            if request.query.get("watch") in ("true", "1"):
                return await self._watch(request, coll, ns)
            return self._list(request, coll, ns)
        key = (coll, ns, name)
        if request.method == "GET":
            self.reads[(coll, name)] += 1
            return self._found(key) or web.json_response(self.objects[key])
        if request.method == "DELETE":
            missing = self._found(key)
            if missing:
                return missing
            self.writes["delete"] += 1
            gone = self.objects.pop(key)
            self.field_managers.pop(key, None)
            self._notify(coll, "DELETED", gone)
            return web.json_response(gone)
        return self._write(request, key, body, sub)

    def _write(
        self, request: web.Request, key: Key, body: dict[str, Any], sub: str | None
    ) -> web.Response:
        """PUT, merge PATCH or server-side apply (which creates when absent)."""
        if request.content_type == "application/apply-patch+yaml":
            self.field_managers.setdefault(key, set()).add(request.query.get("fieldManager", ""))
            if key not in self.objects:
                return self._create(key[0], key[1], body)
        return self._update(key, body, sub, replace=request.method == "PUT")

    def _list(self, request: web.Request, coll: str, ns: str | None) -> web.Response:
        """A list, or one page of it with ``limit``; a continue serves the keys after its last."""
        self.lists[coll] += 1
        found = [((n or "", name), o) for (c, n, name), o in self.objects.items()
                 if c == coll and ns in (None, n)]  # fmt: skip
        rv = int(self._log[-1][0]) if self._log else 0
        token = request.query.get("continue")
        after: tuple[str, str] | None = None
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                rv, after = int(state["rv"]), (str(state["after"][0]), str(state["after"][1]))
            except (ValueError, KeyError, TypeError, IndexError):
                return _status(400, "continue key is not valid")
            if rv < self.compacted:
                return _status(410, "The provided continue parameter is too old")
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        limit = int(request.query.get("limit") or 0)
        if limit > 0:
            found = sorted((k, o) for k, o in found if after is None or k > after)
            if len(found) > limit:
                found = found[:limit]
                last = found[-1][0]
                state = {"rv": rv, "after": list(last)}
                meta["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
        items = [o for _, o in found]
        return web.json_response({"kind": "List", "items": items, "metadata": meta})

    async def _watch(self, request: web.Request, coll: str, ns: str | None) -> web.StreamResponse:
        self.watches += 1
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        since = request.query.get("resourceVersion")
        if since and int(since) < self.compacted:
            gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                    "reason": "Expired", "message": f"too old resource version: {since}"}  # fmt: skip
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            await response.write_eof()
            return response
        if since:
            pos = next((i for i, e in enumerate(self._log) if e[0] > int(since)), len(self._log))
        else:
            pos = len(self._log)
            for (c, n, _), o in list(self.objects.items()):
                if c == coll and ns in (None, n):
                    await _line(response, "ADDED", o)
        timeout = float(request.query.get("timeoutSeconds") or 3600)
        ends = self._ends
        with anyio.move_on_after(timeout):
            while not self._closing and self._ends == ends:
                changed = self._changed
                for _, c, kind, o in self._log[pos:]:
                    if c == coll and ns in (None, o["metadata"].get("namespace")):
                        await _line(response, kind, o)
                pos = len(self._log)
                await changed.wait()
        await response.write_eof()
        return response

    def _review(self, coll: str, body: dict[str, Any]) -> web.Response:
        """Answer a review as the API server does: 201 with ``status`` filled in."""
        if REVIEWS[coll] == "SelfSubjectReview":  # who the worker is: not counted in reviews
            return web.json_response({**body, "status": {"userInfo": self.self_user}}, status=201)
        self.reviews[REVIEWS[coll]] += 1
        spec = body.get("spec") or {}
        if REVIEWS[coll] == "TokenReview":
            status = self._authenticate(spec)
        elif "resourceAttributes" in spec:
            self.access_reviews.append(spec)
            attrs = spec["resourceAttributes"]
            who = {spec["user"], *spec.get("groups", [])}
            grant = (attrs.get("verb"), attrs.get("group", ""), attrs.get("resource"))
            allowed = any((w, *grant) in self.resource_grants for w in who)
        else:
            attrs = spec["nonResourceAttributes"]
            who = {spec["user"], *spec.get("groups", [])}
            allowed = attrs["verb"] == "get" and any((w, attrs["path"]) in self.grants for w in who)
        if REVIEWS[coll] != "TokenReview":
            status = {"allowed": allowed} if allowed else {"allowed": False, "reason": "no rule"}
        return web.json_response({**body, "spec": spec, "status": status}, status=201)

    def _invalid(self, coll: str, body: dict[str, Any]) -> web.Response | None:
        check = self.validators.get(coll)
        message = check(body) if check is not None else None
        return None if message is None else _status(422, message)

    def _found(self, key: Key) -> web.Response | None:
        return None if key in self.objects else _status(404, f"{key[2]} not found")

    def _create(self, coll: str, ns: str | None, body: dict[str, Any]) -> web.Response:
        meta = body.setdefault("metadata", {})
        key = (coll, ns or meta.get("namespace"), meta.get("name", ""))
        if key in self.objects:
            return _status(409, "AlreadyExists")
        body = _clone(body)
        body.pop("status", None)
        invalid = self._invalid(coll, body)
        if invalid:
            return invalid
        self._stamp(body, new=True)
        self.objects[key] = body
        self.writes["create"] += 1
        self._notify(coll, "ADDED", body)
        return web.json_response(body, status=201)

    def _update(
        self, key: Key, body: dict[str, Any], sub: str | None, *, replace: bool
    ) -> web.Response:
        missing = self._found(key)
        if missing:
            return missing
        current = self.objects[key]
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != current["metadata"]["resourceVersion"]:
            return _status(409, "the object has been modified")
        if sub == "status":
            new = _clone(current)
            new["status"] = (
                body.get("status") if replace else merge(current.get("status"), body.get("status"))
            )
        else:
            body = {k: v for k, v in body.items() if k != "status"}
            new = {**body, "status": current.get("status")} if replace else merge(current, body)
            if new.get("status") is None:
                new.pop("status", None)
            new["metadata"] = {**current["metadata"], **new.get("metadata", {})}
            if new.get("spec") != current.get("spec"):
                new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        invalid = self._invalid(key[0], new)
        if invalid:
            return invalid
        self._stamp(new, new=False)
        self.objects[key] = new
        self._notify(key[0], "MODIFIED", new)
        self.writes["update" if replace else "patch"] += 1
        self.object_writes[key] += 1
        return web.json_response(new)


async def _line(response: web.StreamResponse, kind: str, body: dict[str, Any]) -> None:
    await response.write(json.dumps({"type": kind, "object": body}).encode() + b"\n")


def _status(code: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": code,
    }
    return web.Response(
        status=code, text=json.dumps(body), content_type="application/json", headers=headers
    )


@asynccontextmanager
async def fake_api() -> AsyncIterator[tuple[FakeApi, str]]:
    """The fake on a free loopback port: ``(fake, base URL)``; stopped on exit."""
    fake = FakeApi()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        fake.close_watches()
        await runner.cleanup()


def node(name: str, *, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": capacity or {"cpu": "8"}},
    }

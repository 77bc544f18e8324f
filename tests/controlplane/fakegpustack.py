"""A fake GPUStack server for the worker-gateway's tests (reference gpustack-api.md §4).

It plays the server's route ``/v2/clusters/{id}/proxy/{path}`` with the real server's checks, in
its order and with its bodies (401 unknown token, 403 a path that is not a plain Kubernetes API
path, 404 an unknown cluster or another cluster's token, 422 a non-Kubernetes provider, 503 no
READY worker), then answers the Kubernetes path from a small stateful :class:`FakeKube`:
the two APIServices (Available switchable), list and watch of ``worker.gpustack.ai/v1``
kinds (chunked, one JSON event per line, flushed per event, ended at ``timeoutSeconds``), a
forced 410, and a Kubernetes ``Status`` 404 for anything else. Every proxied request is logged.
"""

from __future__ import annotations

import asyncio
import json
import string
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from aiohttp import web

WORKER_GROUP = "apis/worker.gpustack.ai/v1/"
APISERVICES = "apis/apiregistration.k8s.io/v1/apiservices/"
KINDS = {"instancetypes": "InstanceType", "instancetypeflavors": "InstanceTypeFlavor"}


def _k8s_status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


@dataclass
class FakeKube:
    """One cluster's kube-apiserver, as far as the gateway reads it."""

    available: dict[str, bool] = field(
        default_factory=lambda: {"v1.worker.gpustack.ai": True, "v1.gpustack.ai": True}
    )
    objects: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: {p: {} for p in KINDS}
    )
    version: int = 1
    gone_next_watch: bool = False
    watchers: list[asyncio.Queue[dict[str, Any]]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    """Every event, so a watch from a version first replays what came after it."""

    def put(self, plural: str, obj: dict[str, Any]) -> None:
        self.version += 1
        name = obj["metadata"]["name"]
        kind = "MODIFIED" if name in self.objects[plural] else "ADDED"
        obj = {**obj, "apiVersion": "worker.gpustack.ai/v1", "kind": KINDS[plural],
               "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}  # fmt: skip
        self.objects[plural][name] = obj
        self._tell(plural, kind, obj)

    def delete(self, plural: str, name: str) -> None:
        self.version += 1
        obj = self.objects[plural].pop(name)
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        self._tell(plural, "DELETED", obj)

    def _tell(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        event = {"plural": plural, "type": kind, "object": obj, "rv": self.version}
        self.history.append(event)
        for q in self.watchers:
            q.put_nowait(event)

    async def answer(self, request: web.Request, path: str) -> web.StreamResponse:
        if path.startswith(APISERVICES):
            name = path[len(APISERVICES) :]
            if name not in self.available:
                return web.json_response(_k8s_status(404, "NotFound",
                    f'apiservices.apiregistration.k8s.io "{name}" not found'), status=404)  # fmt: skip
            condition = {"type": "Available", "status": "True" if self.available[name] else
                         "False", "reason": "Passed" if self.available[name] else
                         "MissingEndpoints", "message": "all checks passed"}  # fmt: skip
            return web.json_response({"kind": "APIService", "apiVersion": "apiregistration.k8s.io/v1",
                "metadata": {"name": name, "resourceVersion": "1"},
                "status": {"conditions": [condition]}})  # fmt: skip
        plural = path[len(WORKER_GROUP) :] if path.startswith(WORKER_GROUP) else ""
        if plural not in self.objects:
            return web.json_response(_k8s_status(404, "NotFound", "the server could not find "
                                                 "the requested resource"), status=404)  # fmt: skip
        if request.query.get("watch") == "true":
            return await self._watch(request, plural)
        return web.json_response({"kind": KINDS[plural] + "List", "apiVersion": "worker.gpustack.ai/v1",
            "metadata": {"resourceVersion": str(self.version)},
            "items": [self.objects[plural][n] for n in sorted(self.objects[plural])]})  # fmt: skip

    async def _watch(self, request: web.Request, plural: str) -> web.StreamResponse:
        if self.gone_next_watch:
            self.gone_next_watch = False
            return web.json_response(_k8s_status(410, "Expired", "too old resource version"),
                                     status=410)  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        since = int(request.query.get("resourceVersion") or 0)
        for event in self.history:
            if event["rv"] > since:
                queue.put_nowait(event)
        self.watchers.append(queue)
        try:
            async with asyncio.timeout(float(request.query.get("timeoutSeconds", "300"))):
                while True:
                    event = await queue.get()
                    if event["plural"] == plural:
                        line = {"type": event["type"], "object": event["object"]}
                        await response.write(json.dumps(line).encode() + b"\n")
        except TimeoutError:
            pass
        finally:
            self.watchers.remove(queue)
        return response


@dataclass
class Cluster:
    id: int
    name: str
    token: str
    provider: str = "Kubernetes"
    ready_workers: bool = True
    kube: FakeKube = field(default_factory=FakeKube)


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"code": code, "reason": reason, "message": message}, status=code)


def plain_kubernetes_path(raw: str) -> str | None:
    """The server's canonicalisation: decoded once; None when it is not a plain path."""
    path = urllib.parse.unquote(raw)
    bad = set("%\\?#") | {chr(c) for c in range(32)} | {"\x7f"}
    if any(ch in bad for ch in path):
        return None
    segments = [s for s in path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        return None
    return "/".join(segments)


class FakeGPUStack:
    def __init__(self) -> None:
        self.clusters: dict[int, Cluster] = {}
        self.requests: list[dict[str, Any]] = []
        self.port = 0

    def add(self, name: str, **kw: Any) -> Cluster:
        cid = len(self.clusters) + 1
        token = f"gpustack_{cid:016x}_{string.hexdigits[:16] * 2}"
        cluster = Cluster(cid, name, token, **kw)
        self.clusters[cid] = cluster
        return cluster

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        raw = request.match_info["path"]
        self.requests.append({"method": request.method, "cluster": request.match_info["id"],
                              "path": raw, "query": list(request.query.items()),
                              "authorization": auth})  # fmt: skip
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        owner = next((c for c in self.clusters.values() if c.token == token), None)
        if owner is None:
            return _error(401, "Unauthorized", "Invalid authentication credentials")
        path = plain_kubernetes_path(request.raw_path.split("/proxy/", 1)[1].split("?")[0])
        if path is None:
            return _error(403, "Forbidden",
                          "Cluster proxy request path is not a plain Kubernetes API path")  # fmt: skip
        cid = request.match_info["id"]
        cluster = self.clusters.get(int(cid)) if cid.isdigit() else None
        if cluster is None or cluster is not owner:
            return _error(404, "NotFound", f"cluster {cid} not found")
        if cluster.provider != "Kubernetes":
            return _error(422, "Invalid", f"cluster {cluster.name}(id: {cid}) provider is "
                          f"{cluster.provider}; API server proxy is only supported for "
                          "Kubernetes-provider clusters.")  # fmt: skip
        if not cluster.ready_workers:
            return _error(503, "ServiceUnavailable",
                          f"No reachable workers in cluster {cluster.name}(id: {cid})")  # fmt: skip
        return await cluster.kube.answer(request, path)

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[FakeGPUStack]:
        app = web.Application()

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text='"ok"')

        app.router.add_get("/healthz", healthz)
        app.router.add_route("*", "/v2/clusters/{id}/proxy/{path:.*}", self.proxy)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield self
        finally:
            # bounded: a gateway left running by a failed test keeps its watch open, and an
            # unbounded cleanup then hung the whole run instead of failing one test
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await runner.cleanup()

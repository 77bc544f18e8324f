"""The API-serving core over real HTTP, with a provider that supports every verb: watch
bookmarks, ``sendInitialEvents``, Tables on watches, selector-filtered watches, create,
delete with preconditions, subresources and aggregated discovery.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from controlplane.extension.core.failures import ApiFailure
from controlplane.extension.core.model import GroupVersion, ResourceSpec, Subresource
from controlplane.extension.core.server import ApiServer, json_response
from controlplane.extension.core.tables import Column

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

WIDGETS = ResourceSpec(
    plural="widgets", singular="widget", kind="Widget", namespaced=False,
    verbs=("get", "list", "watch", "create", "update", "patch", "delete"),
    schema={"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "size": {"type": "integer"}}}}},
    columns=(Column(name="Size", type="integer", json_path=".spec.size"),),
    subresources=(Subresource(name="double", kind="Widget"),),
)  # fmt: skip
GV = GroupVersion(group="example.test", version="v1", resources=(WIDGETS,))
BASE = "/apis/example.test/v1/widgets"


class Widgets:
    """A dict of widgets, telling watchers of every change."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self._watchers: set[Any] = set()

    def put(self, name: str, size: int, labels: dict[str, str] | None = None) -> None:
        meta: dict[str, Any] = {"name": name, **({"labels": labels} if labels else {})}
        self.items[name] = {"apiVersion": "example.test/v1", "kind": "Widget", "metadata": meta,
                            "spec": {"size": size}}  # fmt: skip
        self._notify()

    def _notify(self) -> None:
        for send in self._watchers:
            send.send_nowait(None)

    async def objects(self) -> list[dict[str, Any]]:
        return list(self.items.values())

    @asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[object]]:
        send, receive = anyio.create_memory_object_stream[object](16)
        self._watchers.add(send)
        try:
            with send, receive:
                yield receive
        finally:
            self._watchers.discard(send)

    async def write(self, old: dict[str, Any] | None, new: dict[str, Any],
                    user: str) -> Sequence[str]:  # fmt: skip
        self.put(new["metadata"]["name"], new["spec"]["size"], new["metadata"].get("labels"))
        return []

    async def delete(self, obj: dict[str, Any], user: str) -> None:
        del self.items[obj["metadata"]["name"]]
        self._notify()

    async def subresource(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "spec": {"size": obj["spec"]["size"] * 2}}


@asynccontextmanager
async def served(widgets: Widgets) -> AsyncIterator[str]:
    core = ApiServer([(GV, {"widgets": widgets})], bookmark_s=0.2)

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            r = core.route(request.path, request.method, request.query)
            if r is None:
                return core.discovery(request.path, request.headers.get("Accept", ""))
            return await core.serve(request, r, "tester")
        except ApiFailure as e:
            return json_response(e.code, e.status())

    app = web.Application()
    app.router.add_route("*", "/apis", handle)
    app.router.add_route("*", "/apis/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def events(response: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    with anyio.fail_after(10):
        return [json.loads(await response.content.readline()) for _ in range(count)]


async def test_initial_events_then_bookmarks() -> None:
    widgets = Widgets()
    widgets.put("a", 1)
    widgets.put("b", 2)
    async with served(widgets) as url, aiohttp.ClientSession() as http:
        response = await http.get(url + BASE, params={
            "watch": "1", "sendInitialEvents": "true", "allowWatchBookmarks": "true",
            "resourceVersionMatch": "NotOlderThan", "resourceVersion": "0",
            "timeoutSeconds": "5"})  # fmt: skip
        seen = await events(response, 4)
        response.close()
    assert [e["type"] for e in seen] == ["ADDED", "ADDED", "BOOKMARK", "BOOKMARK"]
    end = seen[2]["object"]["metadata"]
    assert end["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert end["resourceVersion"] == seen[3]["object"]["metadata"]["resourceVersion"]


async def test_a_watch_ends_after_its_timeout_and_sends_tables_when_asked() -> None:
    widgets = Widgets()
    widgets.put("a", 1)
    table = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    async with served(widgets) as url, aiohttp.ClientSession() as http:
        listed = await (await http.get(url + BASE, headers=table)).json()
        since = listed["metadata"]["resourceVersion"]
        response = await http.get(url + BASE, headers=table, params={
            "watch": "1", "resourceVersion": since, "timeoutSeconds": "1"})  # fmt: skip
        widgets.put("a", 5)
        with anyio.fail_after(10):
            body = await response.read()  # ends by itself after timeoutSeconds
    (event,) = [json.loads(line) for line in body.splitlines()]
    assert event["type"] == "MODIFIED" and event["object"]["kind"] == "Table"
    assert [c["name"] for c in event["object"]["columnDefinitions"]] == ["Name", "Size", "Age"]
    assert event["object"]["rows"][0]["cells"][:2] == ["a", 5]


async def test_a_filtered_watch_sees_objects_leave_and_enter_its_selection() -> None:
    widgets = Widgets()
    widgets.put("a", 1, {"colour": "red"})
    async with served(widgets) as url, aiohttp.ClientSession() as http:
        response = await http.get(url + BASE, params={
            "watch": "1", "labelSelector": "colour=red", "timeoutSeconds": "5"})  # fmt: skip
        first = await events(response, 1)
        widgets.put("a", 1, {"colour": "blue"})
        widgets.put("b", 1, {"colour": "blue"})
        widgets.put("b", 2, {"colour": "red"})
        rest = await events(response, 2)
        response.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in first + rest] == [
        ("ADDED", "a"), ("DELETED", "a"), ("ADDED", "b")]  # fmt: skip


async def test_create_delete_preconditions_subresources_and_discovery() -> None:
    widgets = Widgets()
    body = {"apiVersion": "example.test/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 3}}  # fmt: skip
    v2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    async with served(widgets) as url, aiohttp.ClientSession() as http:
        created = await http.post(url + BASE, json=body)
        again = await (await http.post(url + BASE, json=body)).json()
        double = await (await http.get(f"{url}{BASE}/w/double")).json()
        stale = await http.delete(f"{url}{BASE}/w",
                                  json={"preconditions": {"resourceVersion": "1"}})  # fmt: skip
        gone = await (await http.delete(f"{url}{BASE}/w")).json()
        after = await http.get(f"{url}{BASE}/w")
        discovered = await http.get(url + "/apis", headers={"Accept": v2 + ",application/json"})
        plain = await (await http.get(url + "/apis")).json()
    assert created.status == 201 and (await created.json())["metadata"]["resourceVersion"]
    assert again["reason"] == "AlreadyExists" and again["code"] == 409
    assert double["spec"] == {"size": 6}
    assert stale.status == 409 and "Precondition failed" in (await stale.json())["message"]
    assert gone["status"] == "Success" and gone["details"]["name"] == "w"
    assert after.status == 404
    assert discovered.headers["Content-Type"] == v2
    assert (await discovered.json())["kind"] == "APIGroupDiscoveryList"
    assert plain["kind"] == "APIGroupList"


async def test_patching_or_replacing_nothing_is_not_found() -> None:
    async with served(Widgets()) as url, aiohttp.ClientSession() as http:
        patched = await http.patch(f"{url}{BASE}/nope", data="{}",
                                   headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
        replaced = await http.put(f"{url}{BASE}/nope", json={"spec": {"size": 1}})
        applied = await http.patch(
            f"{url}{BASE}/made?fieldManager=me", data="spec: {size: 2}",
            headers={"Content-Type": "application/apply-patch+yaml"},
        )  # fmt: skip
    assert patched.status == replaced.status == 404
    assert (await patched.json())["details"] == {"name": "nope", "group": "example.test",
                                                 "kind": "widgets"}  # fmt: skip
    assert applied.status == 201  # apply creates where the resource allows create

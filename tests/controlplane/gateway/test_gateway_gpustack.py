"""The worker-gateway driven as a GPUStack server drives it, against a fake GPUStack server.

The gateway runs as a subprocess with the server's exact argv
(``gpustack-operator wg --worker-conn-gpustack-api-port <port> --bind-unix-path <socket>``); the
test subscribes, lists and watches over TLS on the unix socket with a client built the way
``gpustack/gpu_instances/gateway_client.py`` builds its own (no verification, ``localhost``).
The fake server (:mod:`tests.controlplane.fakegpustack`) answers the proxy route with the real
server's checks and bodies and a small stateful kube-apiserver behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from bus.testing import eventually
from tests.controlplane.fakegpustack import FakeGPUStack

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

GVKS = ["worker.gpustack.ai/v1/InstanceType", "worker.gpustack.ai/v1/Instance"]


class UnixTLS(aiohttp.UnixConnector):
    """TLS over the unix socket, as the GPUStack server's client does it."""

    def __init__(self, path: str) -> None:
        super().__init__(path=path)
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: ASYNC109
        _, proto = await self._loop.create_unix_connection(
            self._factory, self._path, ssl=self._tls, server_hostname="localhost"
        )
        return proto


class Gateway:
    def __init__(self, session: aiohttp.ClientSession, proc: asyncio.subprocess.Process) -> None:
        self.session = session
        self.proc = proc

    async def post(self, cluster: str, token: str, *, force: bool = False,
                   gvks: list[str] = GVKS) -> aiohttp.ClientResponse:  # fmt: skip
        params = [("cluster", cluster), ("token", token)] + ([("force", "true")] if force else [])
        async with self.session.post("https://gpustack-operator/apis/workers", params=params,
                                     json={"gvks": gvks}) as r:  # fmt: skip
            await r.read()
            return r

    async def delete(self, cluster: str) -> int:
        async with self.session.delete("https://gpustack-operator/apis/workers",
                                       params={"cluster": cluster}) as r:  # fmt: skip
            return r.status

    async def get(self, path: str, params: list[tuple[str, str]] | None = None) -> Any:
        async with self.session.get(f"https://gpustack-operator{path}", params=params or []) as r:
            body = await r.read()
            return r.status, json.loads(body) if body.strip().startswith(b"{") else body

    async def until(self, path: str, params: list[tuple[str, str]], check: Any) -> Any:
        """Poll a list until ``check(body)`` holds (no timing asserted: the test timeout bounds it)."""
        seen: list[Any] = []

        async def holds() -> bool:
            status, body = await self.get(path, params)
            seen[:] = [body]
            return status == 200 and bool(check(body))

        await eventually(holds, timeout_s=60, interval_s=0.2)
        return seen[0]


@asynccontextmanager
async def gateway(tmp: Path, port: int, *extra: str) -> AsyncIterator[Gateway]:
    sock = str(tmp / "0123456789abcdef.sock")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    log = open(tmp / "gateway.log", "wb")  # noqa: ASYNC230, SIM115 - closed after the process
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpustack_operator.main", "wg",
        "--worker-conn-gpustack-api-port", str(port), "--bind-unix-path", sock,
        "--worker-readiness-check-timeout", "1s", *extra,
        stdout=asyncio.subprocess.DEVNULL, stderr=log, env=env,
    )  # fmt: skip
    try:

        async def started() -> bool:
            assert proc.returncode is None, (tmp / "gateway.log").read_text()
            return await anyio.Path(sock).exists()

        await eventually(started, timeout_s=60)
        async with aiohttp.ClientSession(connector=UnixTLS(sock)) as session:
            gw = Gateway(session, proc)
            await gw.until("/readyz", [], lambda _: True)
            yield gw
    finally:
        if proc.returncode is None:
            proc.terminate()
            with anyio.CancelScope(shield=True), anyio.move_on_after(10) as waited:
                await proc.wait()
            if waited.cancelled_caught:
                proc.kill()
        log.close()


def h200(once: int, remaining: int, *, inactive: bool = False) -> dict[str, Any]:
    spec = {"acceleratorGroup": "nvidia-h200", "generalGroup": "generic", "os": "linux",
            "arch": "amd64", "unit": 1600000, "inactive": inactive}  # fmt: skip
    status = {"accelerator": {"onceMaxRequest": once, "remaining": remaining, "capacity": 8}}
    return {"metadata": {"name": "gpustack--nvidia-h200-linux-amd64"}, "spec": spec,
            "status": status}  # fmt: skip


async def seen(check: Any) -> None:
    async def holds() -> bool:
        return bool(check())

    await eventually(holds, timeout_s=60)


@pytest.fixture
async def fake() -> AsyncIterator[FakeGPUStack]:
    server = FakeGPUStack()
    async with server.serving():
        yield server


def names(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i["cluster"], i["metadata"]["name"]) for i in body["items"]]


async def test_server_argv_subscribe_list_aggregate_and_unsubscribe(
    fake: FakeGPUStack, tmp_path: Path
) -> None:
    east = fake.add("east")
    east.kube.put("instancetypes", h200(8, 8))
    async with gateway(tmp_path, fake.port) as gw:
        assert (await gw.post(str(east.id), east.token)).status == 200
        body = await gw.until("/apis/instancetypes", [("cluster", "1")], lambda b: b["items"])
        assert names(body) == [("1", "gpustack--nvidia-h200-linux-amd64")]
        # Reached through the proxy prefix, with the subscription's token, readiness first.
        first = fake.requests[0]
        assert first["cluster"] == "1" and first["authorization"] == f"Bearer {east.token}"
        assert first["path"] == "apis/apiregistration.k8s.io/v1/apiservices/v1.worker.gpustack.ai"
        assert ("resourceVersion", "0") in first["query"]
        assert fake.requests[1]["path"].endswith("apiservices/v1.gpustack.ai")
        aggregated = (await gw.get("/apis/instancetypes",
                                   [("cluster", "1"), ("aggregated", "true")]))[1]  # fmt: skip
        [item] = aggregated["items"]
        assert item["name"] == "generic-nvidia-h200-linux-amd64"
        assert item["status"]["onceMaxRequest"]["accelerator"] == "8"
        assert item["status"]["tiers"][0]["candidates"][0]["cluster"] == "1"
        # A change upstream reaches the cache through the watch.
        east.kube.put("instancetypes", h200(4, 5))
        await gw.until("/apis/instancetypes", [], lambda b: b["items"] and
                       b["items"][0]["status"]["accelerator"]["remaining"] == 5)  # fmt: skip
        assert await gw.delete("1") == 200
        assert (await gw.get("/apis/instancetypes"))[1] == {"items": []}


async def test_not_ready_states_are_waited_out_not_crashes(
    fake: FakeGPUStack, tmp_path: Path
) -> None:
    east = fake.add("east", ready_workers=False)  # the server's 503 "No reachable workers"
    east.kube.put("instancetypes", h200(8, 8))
    docker = fake.add("dock", provider="Docker")  # 422
    async with gateway(tmp_path, fake.port) as gw:
        await gw.post("1", east.token)
        await gw.post("2", docker.token)
        await gw.post("3", "gpustack_bogus")  # 401
        await gw.post("9", east.token)  # another cluster's token: 404
        await seen(lambda: any(r["cluster"] == "1" for r in fake.requests))
        assert (await gw.get("/apis/instancetypes"))[1] == {"items": []}
        east.ready_workers = True
        body = await gw.until("/apis/instancetypes", [], lambda b: b["items"])
        assert names(body) == [("1", "gpustack--nvidia-h200-linux-amd64")]
        assert gw.proc.returncode is None
        log = (tmp_path / "gateway.log").read_text()
        assert "No reachable workers in cluster east(id: 1)" in log
        assert "Traceback" not in log


async def test_watch_events_and_deleted_null_on_unsubscribe(
    fake: FakeGPUStack, tmp_path: Path
) -> None:
    east = fake.add("east")
    east.kube.put("instancetypes", h200(8, 8))
    async with gateway(tmp_path, fake.port) as gw:
        await gw.post("1", east.token)
        await gw.until("/apis/instancetypes", [], lambda b: b["items"])
        async with gw.session.get("https://gpustack-operator/apis/instancetypes",
                                  params={"watch": "true", "cluster": "1"},
                                  timeout=aiohttp.ClientTimeout(total=None)) as r:  # fmt: skip
            first = json.loads(await r.content.readline())
            assert (first["type"], first["cluster"]) == ("ADDED", "1")
            east.kube.put("instancetypes", h200(2, 2))
            second = json.loads(await r.content.readline())
            assert second["type"] == "MODIFIED"
            assert second["object"]["status"]["accelerator"]["remaining"] == 2
            east.kube.delete("instancetypes", "gpustack--nvidia-h200-linux-amd64")
            assert json.loads(await r.content.readline())["type"] == "DELETED"
            await gw.delete("1")
            assert json.loads(await r.content.readline()) == {
                "type": "DELETED", "cluster": "1", "object": None}  # fmt: skip


async def test_gone_relists_and_absent_kinds_answer_empty(
    fake: FakeGPUStack, tmp_path: Path
) -> None:
    east = fake.add("east")
    async with gateway(tmp_path, fake.port) as gw:
        east.kube.gone_next_watch = True  # the first watch answers 410: list again
        await gw.post("1", east.token)
        await seen(lambda: any(("watch", "true") in r["query"] for r in fake.requests))
        east.kube.put("instancetypes", h200(1, 1))
        await gw.until("/apis/instancetypes", [], lambda b: b["items"])
        lists = [r for r in fake.requests if r["path"].endswith("/instancetypes")
                 and ("limit", "500") in r["query"]]  # fmt: skip
        assert len(lists) >= 2
        # Instance: subscribed, but the cluster does not serve it (404): empty, not an error.
        assert await gw.get("/apis/instances", [("cluster", "1"), ("namespace", "a")]) == (
            200, {"items": []})  # fmt: skip


async def test_live_list_skips_a_failing_cluster_and_subscribe_is_idempotent(
    fake: FakeGPUStack, tmp_path: Path
) -> None:
    east, west = fake.add("east"), fake.add("west")
    flavor = {"metadata": {"name": "f1"}, "spec": {"acceleratable": True, "count": 8}}
    east.kube.put("instancetypeflavors", flavor)
    west.kube.put("instancetypeflavors", flavor)
    async with gateway(tmp_path, fake.port) as gw:
        await gw.post("1", east.token)
        await gw.post("2", west.token)
        both = [("cluster", "1"), ("cluster", "2")]
        body = await gw.until("/apis/instancetypeflavors", both, lambda b: len(b["items"]) == 2)
        agg = (await gw.get("/apis/instancetypeflavors", [*both, ("aggregated", "true")]))[1]
        assert agg == {"items": [{"name": "f1", "spec": {"acceleratable": True, "count": 8,
                                                          "clusters": ["1", "2"]}}]}  # fmt: skip
        west.ready_workers = False  # a live list of west now answers 503: skipped
        body = (await gw.get("/apis/instancetypeflavors", both))[1]
        assert names(body) == [("1", "f1")]
        # A repeat changes nothing (not even the token); force starts over with the new one.
        count = len(fake.requests)
        await gw.post("1", "gpustack_other")
        assert all(r["authorization"] != "Bearer gpustack_other" for r in fake.requests[count:])
        await gw.post("1", "gpustack_other", force=True)
        await seen(
            lambda: any(r["authorization"] == "Bearer gpustack_other" for r in fake.requests)
        )


async def test_bad_requests_are_one_line_400s(fake: FakeGPUStack, tmp_path: Path) -> None:
    async with gateway(tmp_path, fake.port) as gw:
        async with gw.session.post("https://gpustack-operator/apis/workers",
                                   params={"token": "x"}) as r:  # fmt: skip
            assert r.status == 400
            assert (await r.json())["message"] == "cluster is required"
        bad = await gw.post("1", "t", gvks=["InstanceType"])
        assert bad.status == 400
        assert (await gw.post("../2", "t")).status == 400  # it would leave its path segment
        async with gw.session.post("https://gpustack-operator/apis/workers",
                                   json={"clusters": "1", "gvks": "not a list"}) as r:  # fmt: skip
            assert r.status == 400 and "gvks" in (await r.json())["message"]
        # The body alone subscribes too (clusters and token in JSON).
        async with gw.session.post("https://gpustack-operator/apis/workers",
                                   json={"clusters": ["7"], "token": "t", "gvks": []}) as r:  # fmt: skip
            assert r.status == 200
        assert (await gw.get("/apis/instances", [("aggregated", "true")]))[0] == 400
        assert (await gw.get("/apis/instancetypes", [("watch", "maybe")]))[0] == 400
        assert (await gw.get("/apis/nothing"))[0] == 404
        assert (await gw.get("/apis/workers"))[0] == 405
        status, text = await gw.get("/metrics")
        assert status == 200 and b"gpustack_gateway_clusters" in text


async def test_no_flags_starts_in_gpustack_api_mode(tmp_path: Path) -> None:
    """The seed's default mode starts and waits for subscriptions (it exited 2 before)."""
    async with gateway(tmp_path, 30080) as gw:
        assert await gw.get("/apis/instancetypes") == (200, {"items": []})
        assert (await gw.get("/livez"))[0] == 200


async def test_loopback_reads_the_kubeconfig_cluster_for_every_subscription(
    fake: FakeGPUStack, tmp_path: Path
) -> None:
    """Loopback: the cluster id only labels, the token is unused; the kubeconfig's cluster (here
    the fake's proxy prefix of cluster 1, with its token) is what every subscription reads."""
    east = fake.add("east")
    east.kube.put("instancetypes", h200(8, 8))
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {
            "server": f"http://127.0.0.1:{fake.port}/v2/clusters/1/proxy"}}],
        "users": [{"name": "u", "user": {"token": east.token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    async with gateway(tmp_path, fake.port, "--worker-conn-mode=loopback",
                       f"--kubeconfig={config}") as gw:  # fmt: skip
        await gw.post("local", "")
        body = await gw.until("/apis/instancetypes", [], lambda b: b["items"])
        assert names(body) == [("local", "gpustack--nvidia-h200-linux-amd64")]
        east.kube.put("instancetypes", h200(1, 1))  # the watch goes through the kube client
        await gw.until("/apis/instancetypes", [], lambda b:
                       b["items"][0]["status"]["accelerator"]["remaining"] == 1)  # fmt: skip
        assert {r["authorization"] for r in fake.requests} == {f"Bearer {east.token}"}


async def test_without_a_socket_it_serves_the_same_api_over_https(
    fake: FakeGPUStack, tmp_path: Path
) -> None:
    east = fake.add("east")
    east.kube.put("instancetypes", h200(8, 8))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "gpustack_operator.main", "wg", "--bind-unix-path=",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--metrics-auth=none",
            "--kubeconfig=none", "--worker-readiness-check-timeout=1s",
            f"--worker-conn-gpustack-api-port={fake.port}"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.DEVNULL,
                                                env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    base = f"https://127.0.0.1:{port}/apis"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as http:

            async def up() -> bool:
                assert proc.returncode is None
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(base + "/instancetypes") as r:
                        return r.status == 200
                return False

            await eventually(up, timeout_s=60)
            async with http.post(base + "/workers", params={"cluster": "1", "token": east.token},
                                 json={"gvks": GVKS}) as r:  # fmt: skip
                assert r.status == 200

            async def listed() -> bool:
                async with http.get(base + "/instancetypes") as r:
                    return bool((await r.json())["items"])

            await eventually(listed, timeout_s=60)
    finally:
        proc.terminate()
        await proc.wait()

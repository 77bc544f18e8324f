"""End to end with the real GPUStack server (``gpustack==2.3.0``): it spawns our gateway, and
shows our worker's InstanceTypes through its own API, then their removal.

The chain, every link real but the stand-in worker:

    test ── GET /v2/gpu-instance-types/aggregated ──► gpustack server ──► our worker-gateway
        (TLS on the unix socket the server chose)      │ spawned by the server from PATH
    our gateway ── /v2/clusters/1/proxy/... ──► gpustack server ──► stand-in GPUStack worker
        ──► our worker (worker.gpustack.ai/v1 from its bus ledger, --kubeconfig=none)

The stand-in registers with the server under the cluster's registration token, keeps itself
READY (status and heartbeat posts) and forwards ``/cluster-proxy/<path>`` to our worker's API,
answering the two APIService reads from our worker's discovery, as kube-apiserver would.
PostgreSQL (Debian's) runs in a temporary directory. The server lives in its own virtual
environment (``.gpustack-venv``, made by ``.ci/run``; ``GPUSTACK_E2E_VENV`` names another);
without it the test is skipped, unless ``GPUSTACK_REQUIRE_E2E=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import base64
import glob
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
import yarl
from aiohttp import web
from test_controlplane_nms_e2e import publish, settings

from bus import events
from bus.devices import DeviceGroup
from bus.testing import eventually, nats_server, settings_for
from controlplane.worker import running
from tests.controlplane.fakegpustack import FakeGPUStack

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(420)]

HERE = Path(__file__).parents[1]
REPO = HERE.parent.parent
VENV = Path(os.environ.get("GPUSTACK_E2E_VENV") or REPO / ".gpustack-venv")
PASSWORD = "Test-Passw0rd!"
ADMIN = {"Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()}


def _require() -> None:
    missing = [
        w
        for w, ok in (
            ("the gpustack==2.3.0 venv " + str(VENV), (VENV / "bin" / "gpustack").exists()),
            ("PostgreSQL (initdb)", bool(_pg_bin())),
        )
        if not ok
    ]
    if missing:
        why = "needs " + " and ".join(missing) + " (.ci/run installs both)"
        if os.environ.get("GPUSTACK_REQUIRE_E2E") == "1":
            pytest.fail(why)
        pytest.skip(why)


def _pg_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return str(Path(found[-1]).parent) if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres() -> Iterator[int]:
    """A throwaway PostgreSQL on a free loopback port, with an empty ``gpustack`` database."""
    bindir = _pg_bin()
    assert bindir is not None
    root = tempfile.mkdtemp(prefix="gw-e2e-pg-")
    as_pg: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(root, "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    data = f"{root}/data"
    try:
        subprocess.run([*as_pg, f"{bindir}/initdb", "-D", data, "-U", "root", "--auth=trust"],
                       check=True, capture_output=True)  # fmt: skip
        subprocess.run([*as_pg, f"{bindir}/pg_ctl", "-D", data, "-l", f"{root}/pg.log", "-w",
                        "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {root}", "start"],
                       check=True, capture_output=True)  # fmt: skip
        subprocess.run([f"{bindir}/psql", "-h", "127.0.0.1", "-p", str(port), "-U", "root",
                        "-d", "postgres", "-c", "create database gpustack;"],
                       check=True, capture_output=True)  # fmt: skip
        yield port
    finally:
        subprocess.run([*as_pg, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                       check=False, capture_output=True)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def gpustack_server(tmp: Path, pg_port: int) -> AsyncIterator[str]:
    """The real server, with our ``gpustack-operator`` first on its PATH."""
    bindir = tmp / "bin"
    bindir.mkdir()
    wrapper = bindir / "gpustack-operator"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} '
                       f'-m gpustack_operator.main "$@"\n')  # fmt: skip
    wrapper.chmod(0o755)
    port = free_port()
    env = {**os.environ, "HOME": str(tmp / "home"), "PATH": f"{bindir}:{os.environ['PATH']}",
           "GPUSTACK_WORKER_STATUS_SYNC_INTERVAL": "2"}  # fmt: skip
    env.pop("PYTHONPATH", None)
    argv = [str(VENV / "bin" / "gpustack"), "start", "--advertise-address", "127.0.0.1",
            "--data-dir", str(tmp / "data"), "--database-url",
            f"postgresql://root@127.0.0.1:{pg_port}/gpustack?sslmode=disable",
            "--api-port", str(port), "--proxy-port", str(free_port()),
            "--gateway-mode", "disabled", "--disable-metrics", "--disable-update-check",
            "--disable-builtin-observability", "--bootstrap-password", PASSWORD]  # fmt: skip
    with open(tmp / "gpustack.log", "wb") as log:  # noqa: ASYNC230 - once, before it starts
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,  # noqa: ASYNC220
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def healthy() -> bool:
                assert proc.poll() is None, (tmp / "gpustack.log").read_text()[-3000:]
                with suppress(aiohttp.ClientError):
                    async with http.get(url + "/healthz") as r:
                        return r.status == 200
                return False

            await eventually(healthy, timeout_s=120, interval_s=0.5)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the gateway it spawned
        with anyio.move_on_after(20):
            while proc.poll() is None:  # noqa: ASYNC110 - a Popen has no awaitable exit
                await anyio.sleep(0.2)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


APISERVICE_GROUPS = {"v1.worker.gpustack.ai": "/apis/worker.gpustack.ai/v1",
                     "v1.gpustack.ai": "/apis/gpustack.ai/v1"}  # fmt: skip


@asynccontextmanager
async def stand_in(worker_url: str) -> AsyncIterator[int]:
    """A GPUStack worker as far as the server needs one: healthz and /cluster-proxy."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as upstream:

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def proxy(request: web.Request) -> web.StreamResponse:
            path = "/" + request.match_info["path"]
            name = path.removeprefix("/apis/apiregistration.k8s.io/v1/apiservices/")
            if name in APISERVICE_GROUPS:
                async with upstream.get(worker_url + APISERVICE_GROUPS[name]) as r:
                    ok = r.status == 200
                condition = {"type": "Available", "status": "True" if ok else "False",
                             "reason": "Passed" if ok else "FailedDiscoveryCheck"}  # fmt: skip
                return web.json_response({"kind": "APIService",
                    "apiVersion": "apiregistration.k8s.io/v1", "metadata": {"name": name},
                    "status": {"conditions": [condition]}})  # fmt: skip
            async with upstream.get(worker_url + path, params=request.query,
                                    timeout=aiohttp.ClientTimeout(total=None)) as r:  # fmt: skip
                out = web.StreamResponse(status=r.status, headers={
                    "Content-Type": r.headers.get("Content-Type", "application/json")})  # fmt: skip
                await out.prepare(request)
                async for chunk in r.content.iter_any():
                    await out.write(chunk)
                return out

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/cluster-proxy/{path:.*}", proxy)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            yield port
        finally:
            await runner.cleanup()


async def register(http: aiohttp.ClientSession, url: str, token: str, port: int) -> dict[str, Any]:
    body = {"name": "stand-in", "hostname": "stand-in", "ip": "127.0.0.1", "ifname": "lo",
            "advertise_address": "127.0.0.1", "port": port, "worker_uuid": str(uuid.uuid4()),
            "status": {}}  # fmt: skip
    async with http.post(url + "/v2/workers", json=body,
                         headers={"Authorization": f"Bearer {token}"}) as r:  # fmt: skip
        assert r.status in (200, 201), await r.text()
        return dict(await r.json())


async def keep_ready(
    http: aiohttp.ClientSession, url: str, worker: dict[str, Any], port: int
) -> None:
    auth = {"Authorization": f"Bearer {worker['token']}"}
    status = {"hostname": "stand-in", "ip": "127.0.0.1", "ifname": "lo", "port": port,
              "worker_uuid": "x", "status": {}, "state_message": None}  # fmt: skip
    while True:
        with suppress(aiohttp.ClientError):  # a server stopping under it is the test's end
            async with http.post(url + "/v2/worker-status", json=status, headers=auth):
                pass
            async with http.post(url + "/v2/worker-heartbeat", json={}, headers=auth):
                pass
        await anyio.sleep(2)


async def refusals(base: str, cid: int, token: str) -> list[tuple[int, Any]]:
    """The proxy's answers before any worker is READY: 503, 401 twice, 404, 403."""
    ready = "apis/apiregistration.k8s.io/v1/apiservices/v1.worker.gpustack.ai?resourceVersion=0"
    asks = [(cid, token, ready), (cid, None, ready), (cid, "gpustack_" + "0" * 16 + "_" + "0" * 32,
            ready), (99, token, "version"), (cid, token, "apis/%252e%252e/x")]  # fmt: skip
    out = []
    async with aiohttp.ClientSession() as http:
        for cluster, bearer, path in asks:
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            url = yarl.URL(f"{base}/v2/clusters/{cluster}/proxy/{path}", encoded=True)
            async with http.get(url, headers=headers) as r:
                out.append((r.status, await r.json()))
    return out


async def same_refusals_as_the_fake(url: str, cid: int, token: str) -> None:
    """The fake GPUStack of the other gateway tests answers as the real server does (checked
    here against the real one, the oracle)."""
    fake = FakeGPUStack()
    twin = fake.add("k1", ready_workers=False)
    twin.token = token
    async with fake.serving():
        faked = await refusals(f"http://127.0.0.1:{fake.port}", twin.id, token)
    assert cid == twin.id == 1
    assert await refusals(url, cid, token) == faked


async def test_the_real_server_spawns_our_gateway_and_shows_our_instance_types(
    tmp_path: Path,
) -> None:
    _require()
    groups, mig = (
        msgspec.json.decode((HERE / name).read_bytes(), type=tuple[DeviceGroup, ...])
        for name in ("controlplane_detect_h200x8.json", "controlplane_detect_h100x8_mig.json")
    )
    with postgres() as pg_port:
        async with (
            nats_server(tmp_path) as nats,
            anyio.create_task_group() as tg,
            aiohttp.ClientSession(headers=ADMIN) as http,
        ):
            bus = settings_for(nats)
            conf = msgspec.structs.replace(settings(bus, "http://unused"), kube=None,
                                           disable_auths=True)  # fmt: skip
            worker = await tg.start(running.run, conf)
            await publish(bus, events.DevicesEvent(node="s1", ts=datetime.now(UTC), groups=groups))
            await publish(bus, events.DevicesEvent(node="s2", ts=datetime.now(UTC), groups=mig))
            async with stand_in(worker.url) as port, gpustack_server(tmp_path, pg_port) as url:
                cluster = {"name": "k1", "provider": "Kubernetes", "k8s_options": {
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/gpustack",
                                      "volumeSource": {"hostPath": {"path": "/var/lib/gpustack"}}}],
                    "gpuInstanceOptions": {}}}  # fmt: skip
                async with http.post(url + "/v2/clusters", json=cluster) as r:
                    assert r.status in (200, 201), await r.text()
                    cid = (await r.json())["id"]
                async with http.get(f"{url}/v2/clusters/{cid}/registration-token") as r:
                    token = (await r.json())["token"]
                await same_refusals_as_the_fake(url, cid, token)
                registered = await register(http, url, token, port)
                tg.start_soon(keep_ready, http, url, registered, port)
                aggregated = f"{url}/v2/gpu-instance-types/aggregated?cluster_id={cid}"
                shown: list[Any] = []

                async def listed() -> bool:
                    async with http.get(aggregated) as r:
                        shown[:] = (await r.json()).get("items") or [] if r.status == 200 else []
                    return len(shown) >= 2

                await eventually(listed, timeout_s=240, interval_s=1)
                names = [i["name"] for i in shown]
                assert any("nvidia-h200" in n for n in names), names
                h200 = next(i for i in shown if "nvidia-h200" in i["name"])
                assert h200["status"]["onceMaxRequest"]["accelerator"] == "8"
                # MIG partitions: per-profile lists, read by the server's own schema.
                h100 = next(i for i in shown if "nvidia-h100" in i["name"])
                profiles = h100["status"]["remaining"]["acceleratorPartitioned"]
                assert profiles and all(set(p) == {"name", "count"} for p in profiles)
                # The worker goes away: the server unsubscribes, the types leave its answer.
                async with http.delete(f"{url}/v2/workers/{registered['id']}") as r:
                    assert r.status < 300, await r.text()

                async def removed() -> bool:
                    async with http.get(aggregated) as r:
                        return r.status == 200 and not (await r.json()).get("items")

                await eventually(removed, timeout_s=120, interval_s=1)
                log = (tmp_path / "gpustack.log").read_text()
                assert "Unsubscribed cluster" in log
            tg.cancel_scope.cancel()

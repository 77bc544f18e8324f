"""``--metrics-auth=review`` end to end, as a Prometheus with a ServiceAccount token sees it.

Real peers only: the stateful fake API answers TokenReview and SubjectAccessReview from its
tables, a real nats-server carries the agents' review requests to the worker, the device agent
runs on simulated H200s, and every request is real HTTPS verified against the served
certificate.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api
from test_controlplane_worker import worker_settings

from agent.serve import running as agent_running
from agent.serve.settings import ServeSettings
from agent.testing import fake_kubelet
from bus.settings import BusSettings
from bus.testing import eventually, nats_server, settings_for
from controlplane.worker import running
from kit import serving

pytestmark = pytest.mark.anyio

PROMETHEUS = "system:serviceaccount:monitoring:prometheus"
APP = "system:serviceaccount:default:app"


def _users(fake: FakeApi) -> None:
    """Two ServiceAccounts; only Prometheus' is bound to a ClusterRole for our paths."""
    for token, user, ns in (
        ("prom-token", PROMETHEUS, "monitoring"),
        ("app-token", APP, "default"),
    ):
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
        fake.user_token(token, {"username": user, "uid": f"uid-{ns}", "groups": groups})
    fake.grants |= {(PROMETHEUS, "/metrics"), (PROMETHEUS, "/monitor/snapshot")}


async def get(server: serving.Server, path: str, token: str | None = None) -> tuple[int, str]:
    context = ssl.create_default_context(cadata=server.certificate_pem.decode())
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://localhost:{server.port}{path}", ssl=context, headers=headers) as r,
    ):
        return r.status, await r.text()


@asynccontextmanager
async def peers(tmp_path: Path) -> AsyncIterator[tuple[FakeApi, str, BusSettings]]:
    async with nats_server(tmp_path) as server, fake_api() as (fake, url):
        _users(fake)
        yield fake, url, settings_for(server)


async def _worker(tg: anyio.abc.TaskGroup, bus: BusSettings, url: str) -> running.Worker:
    https = serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="review")
    settings = worker_settings(bus, url, https=https, leader=None)
    worker: running.Worker = await tg.start(running.run, settings)
    return worker


def _server(url: str) -> serving.Server:
    """The worker's endpoint; its self-signed certificate is not handed out, so trust by URL."""
    host, _, port = url.removeprefix("https://").rpartition(":")
    return serving.Server(host=host, port=int(port))


async def _unverified(url: str, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(url + path, ssl=False, headers=headers) as r:
        return r.status, await r.text()


async def test_the_worker_reviews_tokens_like_kube_rbac_proxy(tmp_path: Path) -> None:
    async with peers(tmp_path) as (fake, url, bus), anyio.create_task_group() as tg:
        worker = await _worker(tg, bus, url)
        assert (await _unverified(worker.url, "/livez"))[0] == 200
        assert (await _unverified(worker.url, "/readyz"))[0] == 200
        status, text = await _unverified(worker.url, "/metrics")
        assert (status, text) == (401, "no bearer token\n")
        assert await _unverified(worker.url, "/metrics", "forged") == (
            401, "Unauthorized: invalid bearer token\n",
        )  # fmt: skip
        status, text = await _unverified(worker.url, "/metrics", "app-token")
        assert status == 403 and f"Forbidden (user={APP}, verb=get, path=/metrics)" in text
        status, text = await _unverified(worker.url, "/metrics", "prom-token")
        assert status == 200 and "gpustack_worker_leader 1.0" in text
        before = dict(fake.reviews)
        for _ in range(3):
            assert (await _unverified(worker.url, "/metrics", "prom-token"))[0] == 200
            assert (await _unverified(worker.url, "/metrics", "app-token"))[0] == 403
        assert fake.reviews == before, "cached decisions must not reach the API again"
        assert before == {"TokenReview": 3, "SubjectAccessReview": 2}
        tg.cancel_scope.cancel()


def _agent_settings(tmp_path: Path, bus: BusSettings) -> ServeSettings:
    https = serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="review")
    return ServeSettings.for_tests(str(tmp_path), bus=bus, https=https)


async def test_an_agent_endpoint_is_authorized_by_the_worker_over_the_bus(tmp_path: Path) -> None:
    async with (
        peers(tmp_path) as (fake, url, bus),
        anyio.create_task_group() as tg,
    ):
        with fake_kubelet(tmp_path / "kubelet.sock"):
            await _worker(tg, bus, url)
            agent: agent_running.Running = await tg.start(
                agent_running.run, _agent_settings(tmp_path, bus)
            )
            server = agent.server
            assert (await get(server, "/livez"))[0] == 200
            assert (await get(server, "/monitor/snapshot"))[0] == 401
            assert (await get(server, "/monitor/snapshot", "forged"))[0] == 401
            status, text = await get(server, "/monitor/snapshot", "app-token")
            assert status == 403 and f"user={APP}" in text
            status, text = await get(server, "/monitor/snapshot", "prom-token")
            assert status == 200 and msgspec.json.decode(text)["kind"] == "samples"
            status, text = await get(server, "/metrics", "prom-token")
            assert status == 200 and "gpustack_accelerator_memory_total_mib" in text
            assert fake.reviews["SubjectAccessReview"] == 3  # asked by the worker for the agent
            tg.cancel_scope.cancel()


async def test_an_agent_fails_closed_until_the_worker_answers(tmp_path: Path) -> None:
    async with (
        peers(tmp_path) as (fake, url, bus),
        anyio.create_task_group() as tg,
    ):
        with fake_kubelet(tmp_path / "kubelet.sock"):
            agent: agent_running.Running = await tg.start(
                agent_running.run, _agent_settings(tmp_path, bus)
            )
            status, text = await get(agent.server, "/metrics", "prom-token")
            assert status == 503 and text.startswith("authorization unavailable")
            assert (await get(agent.server, "/livez"))[0] == 200
            assert (await get(agent.server, "/metrics"))[0] == 401  # no token: no need to ask
            assert not fake.reviews
            await _worker(tg, bus, url)

            async def served() -> bool:
                return (await get(agent.server, "/metrics", "prom-token"))[0] == 200

            await eventually(served)  # "unavailable" was not cached
            tg.cancel_scope.cancel()

"""The whole device agent in-process: simulated H200s, a real nats-server, a grpcio kubelet.

What kubelet, the bus and a Prometheus scrape see is checked through their own clients: the
grpcio ListAndWatch stream, a bus subscription, HTTPS with the served certificate.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import ssl
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import anyio
import anyio.to_thread
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.devices import nvidia, sources
from agent.devices.simulation.fakenvml import SimulatedNvml
from agent.serve.running import Running, publish_logged, run
from agent.serve.settings import ServeSettings
from agent.testing import FakeKubelet, Watch, fake_kubelet
from bus import events, state
from bus.connection import connect
from bus.embedded import embedded_server, free_port
from bus.errors import StateUnavailable
from bus.metrics import BusMetrics
from bus.publishing import publisher
from bus.settings import BusSettings
from bus.subjects import parse
from bus.subscribing import subscribe
from bus.testing import eventually, example_events, nats_server, settings_for
from kit import serving

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


async def _get(server: serving.Server, path: str) -> tuple[int, str]:
    context = ssl.create_default_context(cadata=server.certificate_pem.decode())
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://localhost:{server.port}{path}", ssl=context) as response,
    ):
        return response.status, await response.text()


def _library(running: Running) -> SimulatedNvml:
    (backend,) = [b for b in running.backends if isinstance(b, nvidia.NvidiaBackend)]
    library = backend.nvml.library
    assert isinstance(library, SimulatedNvml)
    return library


async def _ready(server: serving.Server) -> None:
    """Until ``/readyz`` says 200: every plugin registered (kubelet records a Register before
    the plugin has its reply, so one endpoint kubelet knows is not yet a ready agent)."""

    async def ready() -> bool:
        return (await _get(server, "/readyz"))[0] == 200

    await eventually(ready)


def _check(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


async def _endpoint(kubelet: FakeKubelet, resource: str) -> Path:
    found: list[Path] = []

    def registered() -> bool:
        path = kubelet.endpoint(resource)
        found[:] = [path] if path else []
        return bool(found)

    await eventually(_check(registered))
    return found[0]


async def test_agent_serves_kubelet_bus_and_metrics(tmp_path: Path, kubelet: FakeKubelet) -> None:
    seen: list[events.Event] = []
    async with nats_server(tmp_path) as server:
        bus = settings_for(server)
        settings = ServeSettings.for_tests(str(tmp_path), bus=bus)
        async with connect(bus) as conn:
            await state.ensure_streams(conn, bus)  # the worker's job: agents may not
        async with (
            connect(bus) as conn,
            subscribe(conn, settings=bus, metrics=BusMetrics(), node="test-node") as events_in,
            anyio.create_task_group() as tg,
        ):

            async def collect() -> None:
                async for event in events_in:
                    seen.append(event)  # noqa: PERF401 (read while the test runs)

            tg.start_soon(collect)
            running: Running = await tg.start(run, settings)
            kinds = {"devices", "samples", "agent"}
            await eventually(_check(lambda: kinds <= {events.kind_of(e) for e in seen}))

            endpoint = await _endpoint(kubelet, "nvidia.com/gpu")
            watch = await anyio.to_thread.run_sync(Watch, endpoint)
            try:
                await _xid_makes_a_card_unhealthy(running, watch, seen)
            finally:
                await anyio.to_thread.run_sync(watch.close)
            await _scrape(running)
            tg.cancel_scope.cancel()

    devices_event = next(e for e in seen if isinstance(e, events.DevicesEvent))
    assert sum(len(g.accelerators) for g in devices_event.groups) == 8


async def _xid_makes_a_card_unhealthy(
    running: Running, watch: Watch, seen: list[events.Event]
) -> None:
    library = _library(running)
    uuid = library.cards[0].uuid
    await eventually(_check(lambda: len(watch.latest()) == 8))
    assert set(watch.latest().values()) == {"Healthy"}

    library.inject_xid(0, 13)  # application error: ignored
    library.inject_xid(0, 79)  # fallen off the bus: reset required

    def unhealthy() -> bool:
        return {i for i, h in watch.latest().items() if h == "Unhealthy"} == {
            i for i in watch.latest() if uuid in i
        }

    await eventually(_check(unhealthy))
    health_events = [e for e in seen if isinstance(e, events.HealthEvent)]
    await eventually(_check(lambda: any(isinstance(e, events.HealthEvent) for e in seen)))
    health_events = [e for e in seen if isinstance(e, events.HealthEvent)]
    assert [(e.accelerator_id, e.healthy, e.reason, e.xid) for e in health_events] == [
        (uuid, False, "XID", 79)
    ]
    await eventually(
        _check(
            lambda: any(
                isinstance(e, events.DevicesEvent)
                and any(
                    a.id == uuid and a.status.unhealthy for g in e.groups for a in g.accelerators
                )
                for e in seen
            )
        )
    )


async def _scrape(running: Running) -> None:
    await _ready(running.server)  # every registration counted (on its reply)
    uuid = _library(running).cards[0].uuid
    status, text = await _get(running.server, "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}

    assert status == 200
    unhealthy = {
        s.labels["UUID"]: s.value for s in families["gpustack_accelerator_unhealthy"].samples
    }
    assert unhealthy[uuid] == 1.0
    assert sum(unhealthy.values()) == 1.0
    (first,) = [
        s
        for s in families["gpustack_accelerator_memory_total_mib"].samples
        if s.labels["UUID"] == uuid
    ]
    assert first.labels["gpu"] == "0"
    assert first.labels["modelName"] == "NVIDIA H200"
    assert first.labels["Hostname"] == "test-node"
    assert first.labels["device"].startswith("nvidia")
    assert first.labels["pci_bus_id"]
    assert first.value > 100_000
    assert families["gpustack_agent_detection_pass_seconds"].samples
    assert "gpustack_agent_nvml_errors" in families
    assert "gpustack_bus_outbox_depth" in families
    assert families["gpustack_agent_kubelet_registrations"].samples[0].value >= 1

    assert (await _get(running.server, "/livez"))[0] == 200
    status, body = await _get(running.server, "/monitor/snapshot")
    snapshot = json.loads(body)
    assert status == 200
    assert snapshot["kind"] == "samples"
    assert len(snapshot["samples"][0]["accelerators"]) == 8


async def test_agent_serves_without_the_bus_and_publishes_once_it_is_up(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    port = free_port()
    bus = BusSettings.for_tests(f"nats://127.0.0.1:{port}")  # nothing listens there yet
    settings = ServeSettings.for_tests(str(tmp_path), bus=bus)
    async with anyio.create_task_group() as tg:
        running: Running = await tg.start(run, settings)
        await _endpoint(kubelet, "nvidia.com/gpu")

        await _ready(running.server)  # with nothing listening at the bus's address
        assert not running.publisher.attached
        assert running.publisher.pending >= 3  # devices, agent, samples: held, not lost
        async with embedded_server(tmp_path / "nats", port=port), connect(bus) as conn:
            with pytest.raises(StateUnavailable):  # the agent may not create the streams
                await state.snapshot(conn, bus, node=settings.node_name)
            await state.ensure_streams(conn, bus)  # the worker's job

            async def published() -> bool:
                stored = await state.snapshot(conn, bus, node=settings.node_name)
                return {parse(subject)[1] for subject, _ in stored} >= {"devices", "agent"}

            await eventually(published, timeout_s=20)
            tg.cancel_scope.cancel()


async def test_an_event_the_bus_refuses_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = example_events("no spaces allowed")[5]  # an AgentEvent whose node is no subject token
    bus = BusSettings.for_tests("nats://127.0.0.1:1")
    async with publisher(settings=bus, metrics=BusMetrics()) as pub:
        publish_logged(pub, bad)
        assert pub.pending == 0
    publish_logged(pub, example_events("test-node")[5])  # closed: refused, logged
    assert caplog.text.count("cannot publish agent event") == 2


def _sockets(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.sock"))


def _sim_trees(scratch: Path) -> set[str]:
    return {n for n in os.listdir(scratch) if n.startswith("gpustack-sim-")}


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.15, 0.4])
async def test_cancelled_mid_start_leaves_nothing_behind(
    tmp_path: Path, kubelet: FakeKubelet, delay: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The simulated tree is laid out in a scratch directory of this test's own, not the shared
    # /dev/shm where other tests and runs (xdist's other worker) make and remove theirs.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(sources, "_scratch_dir", lambda: str(scratch))
    threads = set(threading.enumerate())
    tasks = asyncio.all_tasks()
    settings = ServeSettings.for_tests(
        str(tmp_path), bus=BusSettings.for_tests("nats://127.0.0.1:1")
    )
    libraries: list[SimulatedNvml] = []

    async def started() -> None:
        async with anyio.create_task_group() as tg:
            running: Running = await tg.start(run, settings)
            libraries.append(_library(running))
            await anyio.sleep_forever()

    with anyio.move_on_after(delay):
        await started()
    # A leaked socket or stream only warns when collected: collect now, so a leak fails this
    # test (filterwarnings=error) instead of whichever later test the collector runs in.
    gc.collect()

    assert _sockets(tmp_path) == ["kubelet.sock"]
    assert _sim_trees(scratch) == set()
    assert asyncio.all_tasks() - tasks == set()
    ours = set(threading.enumerate()) - threads
    # anyio keeps idle pool workers; the fake kubelet's own pool is the peer's, not ours
    leftover = [t for t in ours if not t.name.startswith(("AnyIO worker", "fake-kubelet"))]
    assert leftover == []
    assert all(lib.refcount == 0 for lib in libraries)


async def test_without_kubelet_the_agent_says_so_and_is_not_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    settings = ServeSettings.for_tests(
        str(tmp_path), bus=BusSettings.for_tests(f"nats://127.0.0.1:{port}")
    )
    async with anyio.create_task_group() as tg:
        running: Running = await tg.start(run, settings)

        async def waiting_logged() -> bool:
            return any("waiting for kubelet at" in r.getMessage() for r in caplog.records)

        await eventually(waiting_logged)
        assert (await _get(running.server, "/readyz"))[0] == 503
        with fake_kubelet(tmp_path / "kubelet.sock") as kubelet:
            await _endpoint(kubelet, "nvidia.com/gpu")
            await _ready(running.server)
        tg.cancel_scope.cancel()
    warnings = [r for r in caplog.records if "waiting for kubelet" in r.getMessage()]
    assert len(warnings) == 1, "logged once per change, not every pass"

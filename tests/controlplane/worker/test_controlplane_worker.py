"""The worker end to end: real nats-server, the real kubernetes_asyncio client, a stateful fake API."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node
from prometheus_client.parser import text_string_to_metric_families

from bus import codec, connection, events, kv, publishing, subjects
from bus.devices import DeviceGroup
from bus.metrics import BusMetrics
from bus.testing import eventually, nats_server, settings_for
from controlplane.k8s.client import KubeSettings
from controlplane.reconciling.sinks import KvSink
from controlplane.resources import DEVICES, Ref
from controlplane.worker import leading, running
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio
HERE = Path(__file__).parents[1]
GROUPS = msgspec.json.decode(
    (HERE / "controlplane_detect_h100x8_mig.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def worker_settings(bus_url: object, api_url: str | None, **over: object) -> running.WorkerSettings:
    base = running.WorkerSettings(
        concurrency=16,
        bus=bus_url,  # type: ignore[arg-type]
        kube=None if api_url is None else KubeSettings.for_tests(api_url, backoff_s=0.01),
        https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
        leader=leading.LeaderSettings(name="w", namespace="ns", lease_s=1.0, renew_timeout_s=0.6),
        identity="w1",
        resync_s=0.3,
    )
    return msgspec.structs.replace(base, **over)


@asynccontextmanager
async def stack(tmp_path: Path, *, api: bool = True) -> AsyncIterator[tuple[FakeApi, str, object]]:
    async with nats_server(tmp_path) as server, fake_api() as (fake, url):
        yield fake, url, settings_for(server)


async def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """GET ``/metrics`` over HTTPS (self-signed) and parse it: ``(name, labels) -> value``."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics", ssl=False) as r:
        assert r.status == 200
        text = await r.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def publish(bus: object, evs: list[events.Event]) -> None:
    async with connection.connect(bus, name="test") as conn:  # type: ignore[arg-type]
        for e in evs:
            await conn.publish(subjects.subject(e.node, events.kind_of(e)), codec.encode(e))
        await conn.flush()


async def test_events_become_objects_and_bad_ones_are_counted(tmp_path: Path) -> None:
    async with stack(tmp_path) as (fake, url, bus), anyio.create_task_group() as tg:
        fake.put_object("api/v1/nodes", node("n1"))
        fake.fail_next("PATCH", "/apis/worker.gpustack.ai/v1alpha1/devices/n1", 409)
        w: running.Worker = await tg.start(running.run, worker_settings(bus, url))
        acc = GROUPS[0].accelerators[0]
        await publish(bus, [
            events.DevicesEvent(node="n1", ts=T0, groups=GROUPS),
            events.AllocationEvent(node="n1", ts=T0, allocation_id="p/c", action="allocated",
                                   resource="nvidia.com/gpu.partitioned",
                                   device_ids=(f"{GROUPS[0].id}:{acc.id}:0000",)),
            events.ModelsEvent(node="n1", ts=T0, models=(events.ModelState(model="sha256:" + "a" * 64, state="ready", bytes_done=5, bytes_total=5),)),
            events.DevicesEvent(node="ghost", ts=T0, groups=GROUPS),
        ])  # fmt: skip
        async with connection.connect(bus, name="bad") as conn:  # type: ignore[arg-type]
            await conn.publish(subjects.subject("n1", "devices"), b"{not json")

        async def done() -> bool:
            devs = fake.objects.get(("apis/worker.gpustack.ai/v1alpha1/devices", None, "n1"))
            return bool(
                devs
                and devs.get("status")
                and w.metrics.count(
                    "gpustack_worker_events_rejected_total", kind="node", reason="unknown_node"
                )
            )

        await eventually(done)
        devs = fake.get("apis/worker.gpustack.ai/v1alpha1/devices", "n1")
        assert devs["spec"]["groups"] == json.loads(
            (HERE / "controlplane_detect_h100x8_mig.json").read_text()
        )
        assert devs["metadata"]["ownerReferences"][0]["kind"] == "Node"
        card = devs["status"]["groups"][0]["accelerators"][0]
        assert card["mode"] == "Partitioned" and card["allocated"] > 0
        await eventually(lambda: _has(fake, "nodemodelstores", "n1"))

        async def node_converged() -> bool:
            # Labels and capacity are the last writes of a reconcile: wait, don't race them.
            n1 = fake.get("api/v1/nodes", "n1")
            labels = n1["metadata"].get("labels") or {}
            return labels.get("acceleratable.feature.gpustack.ai/nvidia") == "true" and (
                "nvidia.com/gpu.partitioned.units" in (n1.get("status") or {}).get("capacity", {})
            )

        await eventually(node_converged)
        assert ("apis/worker.gpustack.ai/v1alpha1/devices", None, "ghost") not in fake.objects
        assert (
            w.metrics.count(
                "gpustack_bus_dropped_messages_total", kind="devices", reason="malformed"
            )
            == 1
        )
        m = await scrape(w.url)
        assert sample(m, "gpustack_worker_events_consumed_total", kind="devices") == 2
        assert sample(m, "gpustack_worker_events_consumed_total", kind="allocations") == 1
        assert sample(m, "gpustack_bus_dropped_messages_total", kind="devices", reason="malformed")
        assert (sample(m, "gpustack_worker_reconcile_seconds_count", kind="node") or 0) >= 1
        assert (
            sample(m, "gpustack_worker_api_requests_total", verb="create", result="ok") or 0
        ) >= 2
        assert sample(m, "gpustack_worker_api_requests_total", verb="patch", result="409") == 1
        assert sample(m, "gpustack_worker_queue_depth") is not None
        assert (sample(m, "gpustack_worker_event_to_object_seconds_count") or 0) >= 1
        crd = (
            "apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            None,
            "devices.worker.gpustack.ai",
        )
        assert crd in fake.objects
        # The Node goes away: its objects follow.
        fake.remove("api/v1/nodes", "n1")
        await eventually(lambda: _gone(fake, "devices", "n1"))
        tg.cancel_scope.cancel()


async def _has(fake: FakeApi, plural: str, name: str) -> bool:
    return (f"apis/worker.gpustack.ai/v1alpha1/{plural}", None, name) in fake.objects


async def _gone(fake: FakeApi, plural: str, name: str) -> bool:
    return not await _has(fake, plural, name)


async def test_flood_ends_with_latest_state_and_bounded_writes(tmp_path: Path) -> None:
    nodes = [f"node-{i:03d}.example" for i in range(500)]
    async with stack(tmp_path) as (fake, url, bus), anyio.create_task_group() as tg:
        for n in nodes:
            fake.put_object("api/v1/nodes", node(n))
        # Resync every 30 s, not 0.3 s: each one re-queues all 500 nodes, which is not what this
        # test measures and made it race its deadline on a busy machine.
        await tg.start(running.run, worker_settings(bus, url, resync_s=30.0))
        evs: list[events.Event] = []
        for seq in range(20):
            for n in nodes:
                g = msgspec.structs.replace(GROUPS[0], memory=1000 + seq)
                evs.append(events.DevicesEvent(node=n, ts=T0 + timedelta(seconds=seq), groups=(g,)))
        await publish(bus, evs)

        async def latest() -> bool:
            for n in nodes:
                o = fake.objects.get(("apis/worker.gpustack.ai/v1alpha1/devices", None, n))
                if not o or o["spec"]["groups"][0]["memory"] != 1019:
                    return False
            return True

        await eventually(latest, timeout_s=40)
        writes = sum(fake.writes.values())
        # Without coalescing: 10,000 events x 2+ writes. With it: a few per node.
        assert writes < 500 * 12, writes
        tg.cancel_scope.cancel()


async def test_leader_failover(tmp_path: Path) -> None:
    async with stack(tmp_path) as (fake, url, bus):
        fake.put_object("api/v1/nodes", node("n1"))
        async with anyio.create_task_group() as outer:
            one = anyio.CancelScope()

            async def first(*, task_status: anyio.abc.TaskStatus[running.Worker]) -> None:
                with one:
                    await running.run(
                        worker_settings(bus, url, identity="a"), task_status=task_status
                    )

            a: running.Worker = await outer.start(first)
            b: running.Worker = await outer.start(
                running.run, worker_settings(bus, url, identity="b")
            )
            await eventually(lambda: _true(a.leading or b.leading))
            assert not (a.leading and b.leading)
            leader, scope = (a, one) if a.leading else (b, outer.cancel_scope)
            other = b if leader is a else a
            if leader is a:
                one.cancel()
                await eventually(lambda: _true(other.leading), timeout_s=5)
                await publish(bus, [events.DevicesEvent(node="n1", ts=T0, groups=GROUPS)])
                await eventually(lambda: _has(fake, "devices", "n1"))
            else:
                # b leads: a keeps following with a warm ledger.
                await publish(bus, [events.DevicesEvent(node="n1", ts=T0, groups=GROUPS)])
                await eventually(lambda: _true(a.processor.ledger.get("n1") is not None))
                assert not a.leading
            outer.cancel_scope.cancel()
            del scope


async def _true(value: bool) -> bool:
    return value


async def _holds(sink: KvSink, ref: Ref, groups: int) -> bool:
    o = await sink.get(ref)
    return o is not None and len(o.body["spec"]["groups"]) == groups


async def _folded(w: running.Worker, node: str, groups: int) -> bool:
    state = w.processor.ledger.get(node)
    return state is not None and state.groups is not None and len(state.groups) == groups


async def test_a_future_stamped_event_is_refused_and_the_real_agent_still_wins(
    tmp_path: Path,
) -> None:
    """A valid event stamped 2099 with no groups neither empties the node nor locks out the real
    agent's republish: it is refused (counted), the real one is applied; a worker restarted
    while the forged event is the last one retained walks back past it."""
    node, year_2099 = "ip-10-0-0-1.ec2.internal", datetime(2099, 1, 1, tzinfo=UTC)
    forged = codec.encode(events.DevicesEvent(node=node, ts=year_2099, groups=()))
    real = codec.encode(events.DevicesEvent(node=node, ts=T0, groups=GROUPS))
    refused = {"kind": "devices", "reason": "future"}
    async with nats_server(tmp_path) as server, connection.connect(settings_for(server)) as conn:
        bus, subject = settings_for(server), subjects.subject(node, "devices")
        ref = Ref(resource=DEVICES, name=node)
        async with anyio.create_task_group() as tg:
            w: running.Worker = await tg.start(running.run, worker_settings(bus, None))
            for payload in (forged, real):
                await conn.publish_acked(subject, payload)
            sink = KvSink(await kv.open_bucket(conn, kv.LEDGER_BUCKET))
            await eventually(functools.partial(_holds, sink, ref, len(GROUPS)))
            m = await scrape(w.url)
            assert sample(m, "gpustack_bus_dropped_messages_total", **refused) == 1
            await conn.publish_acked(subject, forged)  # now the last message retained
            tg.cancel_scope.cancel()
        async with anyio.create_task_group() as tg:
            w = await tg.start(running.run, worker_settings(bus, None))
            await eventually(functools.partial(_folded, w, node, len(GROUPS)))
            m = await scrape(w.url)
            assert sample(m, "gpustack_bus_dropped_messages_total", **refused) == 1
            assert await _holds(sink, ref, len(GROUPS))
            tg.cancel_scope.cancel()


async def test_kv_sink_roundtrip_and_standalone(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as server, anyio.create_task_group() as tg:
        bus = settings_for(server)
        w: running.Worker = await tg.start(running.run, worker_settings(bus, None))
        await publish(
            bus, [events.DevicesEvent(node="ip-10-0-0-1.ec2.internal", ts=T0, groups=GROUPS)]
        )
        async with connection.connect(bus, name="reader") as conn:
            sink = KvSink(await kv.open_bucket(conn, kv.LEDGER_BUCKET))
            ref = Ref(resource=DEVICES, name="ip-10-0-0-1.ec2.internal")

            async def stored() -> bool:
                o = await sink.get(ref)
                return o is not None and "status" in o.body

            await eventually(stored)
            o = await sink.get(ref)
            assert o is not None and len(o.body["spec"]["groups"]) == len(GROUPS)
            # The store spec is pushed after the Devices and NodeModelStore writes of the same
            # reconcile: wait for it too (asserting right after ``stored`` raced that push).
            agents = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
            key = kv.nms_key("ip-10-0-0-1.ec2.internal")

            async def pushed() -> bool:
                return await agents.get(key) is not None

            await eventually(pushed)
            rec = await agents.get(key)
            assert rec is not None and b"watermarks" in rec[0]
        assert w.leading
        m = await scrape(w.url)
        # One create (status included) of Devices and of NodeModelStore, the store spec push;
        # the primed cache knows both objects are new, so no get precedes the creates.
        assert sample(m, "gpustack_worker_api_requests_total", verb="kv_put", result="ok") == 3
        assert not sample(m, "gpustack_worker_api_requests_total", verb="kv_get", result="ok")
        assert sample(m, "gpustack_worker_events_consumed_total", kind="devices") == 1
        tg.cancel_scope.cancel()
    assert kv.unescape(kv.escape("a.b=c/ü")) == "a.b=c/ü"
    _ = (BusMetrics, publishing)

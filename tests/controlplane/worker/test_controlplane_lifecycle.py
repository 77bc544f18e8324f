"""The worker's life: gone Nodes noticed by the watch, cancellation mid-start and mid-reconcile.

Cancellation invariants (checked after every cancelled worker):

- no task is left behind (the event loop holds the tasks it held before the worker started);
- the Lease is not held by the cancelled replica: it is *released* (``holderIdentity`` cleared)
  on the way out, even when cancelled in the middle of the acquiring request;
- no half-written object: every ``Devices`` object has its ``status`` (a create and its status
  patch finish together under a bounded shield).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node

from bus import codec, connection, events, state, subjects
from bus.devices import DeviceGroup
from bus.settings import BusSettings
from bus.testing import eventually, nats_server, settings_for
from controlplane.k8s.client import KubeSettings
from controlplane.worker import leading, running
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio
HERE = Path(__file__).parents[1]
GROUPS = msgspec.json.decode(
    (HERE / "controlplane_detect_h100x8_mig.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DEVICES = "apis/worker.gpustack.ai/v1alpha1/devices"
STORES = "apis/worker.gpustack.ai/v1alpha1/nodemodelstores"
LEASES = "apis/coordination.k8s.io/v1/leases"


def settings(bus: BusSettings, api_url: str, **over: Any) -> running.WorkerSettings:
    base = running.WorkerSettings(
        concurrency=16,
        bus=bus,
        kube=KubeSettings.for_tests(api_url, backoff_s=0.01),
        https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
        leader=leading.LeaderSettings(name="w", namespace="ns", lease_s=5.0, renew_timeout_s=3.0),
        identity="w1",
        resync_s=3600.0,
    )
    return msgspec.structs.replace(base, **over)


@asynccontextmanager
async def stack(tmp_path: Path) -> AsyncIterator[tuple[FakeApi, str, BusSettings]]:
    async with nats_server(tmp_path) as server, fake_api() as (fake, url):
        yield fake, url, settings_for(server)


async def publish(bus: BusSettings, evs: list[events.Event]) -> None:
    async with connection.connect(bus, name="test") as conn:
        await state.ensure_streams(conn, bus)  # retained even before any worker ran
        for e in evs:
            await conn.publish(subjects.subject(e.node, events.kind_of(e)), codec.encode(e))
        await conn.flush()


async def _two_nodes_reporting(
    fake: FakeApi, url: str, bus: BusSettings, tg: anyio.abc.TaskGroup
) -> None:
    """Nodes n1 and n2 registered, a worker (hourly resync) running, both nodes' devices sent."""
    for name in ("n1", "n2"):
        fake.put_object("api/v1/nodes", node(name))
    await tg.start(running.run, settings(bus, url))
    await publish(bus, [events.DevicesEvent(node=n, ts=T0, groups=GROUPS) for n in ("n1", "n2")])


async def test_a_deleted_node_loses_its_objects_through_the_watch(tmp_path: Path) -> None:
    async with stack(tmp_path) as (fake, url, bus), anyio.create_task_group() as tg:
        # resync every hour: only the watch can notice the deletion within the test.
        await _two_nodes_reporting(fake, url, bus, tg)

        async def both() -> bool:
            return all(
                (c, None, n) in fake.objects for c in (DEVICES, STORES) for n in ("n1", "n2")
            )

        await eventually(both, timeout_s=30)
        assert fake.watches >= 1
        fake.remove("api/v1/nodes", "n1")

        async def n1_gone() -> bool:
            return not any((c, None, "n1") in fake.objects for c in (DEVICES, STORES))

        await eventually(n1_gone, timeout_s=30)
        assert (DEVICES, None, "n2") in fake.objects
        tg.cancel_scope.cancel()


async def test_a_node_deleted_while_the_watch_was_down_loses_its_objects(tmp_path: Path) -> None:
    """The Node informer lists again after a failed watch: a Node gone meanwhile is DELETED for
    the processor as if the watch had seen it (the resync, hourly here, is not needed)."""
    async with stack(tmp_path) as (fake, url, bus), anyio.create_task_group() as tg:
        await _two_nodes_reporting(fake, url, bus, tg)

        async def both() -> bool:
            return all((DEVICES, None, n) in fake.objects for n in ("n1", "n2"))

        await eventually(both, timeout_s=30)
        lists = fake.lists["api/v1/nodes"]
        held = fake.hold("GET", "/api/v1/nodes")  # the watch resumed after the stream ended
        fake.end_watches()
        await held.reached.wait()
        fake.compact()
        fake.objects.pop(("api/v1/nodes", None, "n1"))  # gone, and no watch will tell
        fake.fail_next("GET", "/api/v1/nodes", 500)  # the resumed watch fails: list again
        held.release.set()

        async def n1_gone() -> bool:
            return (DEVICES, None, "n1") not in fake.objects

        await eventually(n1_gone, timeout_s=30)
        assert fake.lists["api/v1/nodes"] > lists
        assert (DEVICES, None, "n2") in fake.objects
        tg.cancel_scope.cancel()


async def test_the_resync_reads_node_presence_from_the_informer(tmp_path: Path) -> None:
    """Once the informer has listed, the periodic resync lists only the Devices: those of a Node
    deleted while no worker ran are removed, and a name the informer lacks (a Node created a
    moment ago, not yet on the watch) is read once before it counts as gone."""
    async with stack(tmp_path) as (fake, url, bus), anyio.create_task_group() as tg:
        for name in ("n1", "n2"):
            fake.put_object("api/v1/nodes", node(name))
        fake.put_object(DEVICES, {"kind": "Devices", "metadata": {"name": "ghost"}, "status": {}})
        await tg.start(running.run, settings(bus, url, resync_s=0.2))
        await publish(
            bus, [events.DevicesEvent(node=n, ts=T0, groups=GROUPS) for n in ("n1", "n2")]
        )

        async def settled() -> bool:
            present = all((DEVICES, None, n) in fake.objects for n in ("n1", "n2"))
            return present and (DEVICES, None, "ghost") not in fake.objects

        await eventually(settled, timeout_s=30)
        node_lists, device_lists = fake.lists["api/v1/nodes"], fake.lists[DEVICES]
        # Behind the watch's back: no event tells the informer of this Node.
        fake.objects[("api/v1/nodes", None, "n3")] = node("n3")
        body = copy.deepcopy(fake.get(DEVICES, "n2"))
        body["metadata"]["name"] = "n3"
        fake.objects[(DEVICES, None, "n3")] = body

        async def n3_read() -> bool:  # a resync listed n3's Devices, and asked for its Node
            return fake.reads[("api/v1/nodes", "n3")] >= 1 and fake.lists[DEVICES] > device_lists

        await eventually(n3_read, timeout_s=30)
        done = fake.lists[DEVICES]  # a list is counted when it arrives, processed after

        async def resynced_once_more() -> bool:  # passes run one after another
            return fake.lists[DEVICES] > done

        await eventually(resynced_once_more, timeout_s=30)
        assert all((DEVICES, None, n) in fake.objects for n in ("n1", "n2", "n3"))
        assert fake.lists["api/v1/nodes"] == node_lists
        tg.cancel_scope.cancel()


def _tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if not t.done()}


async def _invariants(fake: FakeApi, before: set[asyncio.Task[Any]], identity: str) -> None:
    async def settled() -> bool:
        return _tasks() <= before

    await eventually(settled, timeout_s=30)
    lease = fake.objects.get((LEASES, "ns", "w"))
    assert lease is None or lease["spec"].get("holderIdentity") != identity
    for (collection, _, name), obj in fake.objects.items():
        if collection == DEVICES:
            assert "status" in obj, f"Devices {name} was left without its status"


# Delays of a few milliseconds land inside the first NATS connect (a half-open client must be
# closed on cancellation), later ones inside reconciles and the HTTPS start.
@pytest.mark.parametrize("delay_s", [0.0, 0.002, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4])
async def test_cancelled_mid_start_leaves_nothing_behind(tmp_path: Path, delay_s: float) -> None:
    async with stack(tmp_path) as (fake, url, bus):
        fake.put_object("api/v1/nodes", node("n1"))
        # Retained: the worker reconciles it as part of starting.
        await publish(bus, [events.DevicesEvent(node="n1", ts=T0, groups=GROUPS)])
        before = _tasks()
        with anyio.move_on_after(delay_s) as scope:
            await running.run(settings(bus, url))
        assert scope.cancelled_caught
        await _invariants(fake, before, "w1")
        # A successor starts at once (the Lease was released, not left to expire).
        async with anyio.create_task_group() as tg:
            w: running.Worker = await tg.start(running.run, settings(bus, url, identity="w2"))
            await eventually(lambda: _true(w.leading), timeout_s=30)
            await eventually(lambda: _has_status(fake, "n1"), timeout_s=30)
            tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("method", "path", "after"),
    [
        # The Devices object exists; its status patch is in flight.
        ("PATCH", f"/{DEVICES}/n1/status", False),
        # The Lease was created for this replica, but the answer has not arrived yet.
        ("POST", f"/{LEASES}".replace("leases", "namespaces/ns/leases"), True),
    ],
)
async def test_cancelled_mid_request(tmp_path: Path, method: str, path: str, after: bool) -> None:
    async with stack(tmp_path) as (fake, url, bus):
        fake.put_object("api/v1/nodes", node("n1"))
        held = fake.hold(method, path, after=after)
        before = _tasks()
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def worker() -> None:
                with scope:
                    await running.run(settings(bus, url))

            tg.start_soon(worker)
            await publish(bus, [events.DevicesEvent(node="n1", ts=T0, groups=GROUPS)])
            await held.reached.wait()
            scope.cancel()
            # Let the cancellation reach every task of the worker before the API answers.
            await anyio.wait_all_tasks_blocked()
            held.release.set()
        await _invariants(fake, before, "w1")
        lease = fake.objects.get((LEASES, "ns", "w"))
        assert lease is not None and lease["spec"].get("holderIdentity") is None  # released


async def _true(value: bool) -> bool:
    return value


async def _has_status(fake: FakeApi, name: str) -> bool:
    obj = fake.objects.get((DEVICES, None, name))
    return obj is not None and "status" in obj

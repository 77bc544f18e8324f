"""The hot-path caches: the KV sink's revisions, the primed reconciler, parked unknown nodes.

Each cache is only a guess; these tests write behind its back (another writer, a restarted
worker, a Node that appears late) and check that the result is still exactly right.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import msgspec
import pytest
from controlplane_fakeapi import fake_api, node

from bus import codec, connection, events, kv, subjects
from bus.devices import DeviceGroup
from bus.testing import eventually, nats_server, settings_for
from controlplane import errors
from controlplane.k8s.client import KubeSettings
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling import objects
from controlplane.reconciling.nodes import NodeReconciler
from controlplane.reconciling.nodestates import Ledger
from controlplane.reconciling.planning import plan
from controlplane.reconciling.sinks import KvSink, ledger_key
from controlplane.resources import DEVICES, NODEMODELSTORES, Observed, Ref
from controlplane.worker import leading, running
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio
HERE = Path(__file__).parents[1]
GROUPS = msgspec.json.decode(
    (HERE / "controlplane_detect_h100x8_mig.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
REF = Ref(resource=DEVICES, name="n1")
DEVICES_PATH = "apis/worker.gpustack.ai/v1alpha1/devices"


def allocation(node: str, seq: int, action: str = "allocated") -> events.AllocationEvent:
    card = GROUPS[0].accelerators[0]
    return events.AllocationEvent(
        node=node, ts=T0 + timedelta(seconds=seq), allocation_id="p/c", action=action,  # type: ignore[arg-type]
        resource="nvidia.com/gpu.partitioned", device_ids=(f"{GROUPS[0].id}:{card.id}:0000",),
    )  # fmt: skip


def test_devices_spec_read_back_as_json_plans_no_write() -> None:
    ledger = Ledger()
    ledger.apply(events.DevicesEvent(node="n1", ts=T0, groups=GROUPS))
    state = ledger.get("n1")
    assert state is not None
    desired, _ = objects.devices("n1", None, state)
    assert desired is not None
    (create,) = plan(REF, desired, None, status_on_create=True)
    stored = json.loads(json.dumps(create.body))  # what any sink hands back: lists, not tuples
    stored["metadata"]["resourceVersion"] = "7"
    assert plan(REF, desired, Observed.of(stored)) == []


def test_parked_nodes_are_bounded_oldest_forgotten_first() -> None:
    ledger = Ledger(max_parked=2)
    for n in ("a", "b", "c"):
        ledger.apply(events.DevicesEvent(node=n, ts=T0, groups=GROUPS))
    assert ledger.park("a") == [] and ledger.park("b") == [] and ledger.park("a") == []
    assert ledger.park("c") == ["a"]
    assert ledger.get("a") is None and ledger.parked() == ["b", "c"]
    ledger.unpark("b")
    assert not ledger.is_parked("b") and ledger.get("b") is not None
    assert ledger.park("never-seen") == []


async def test_kv_sink_patches_without_get_and_survives_an_external_write(
    tmp_path: Path,
) -> None:
    calls: Counter[tuple[str, str]] = Counter()
    async with (
        nats_server(tmp_path) as server,
        connection.connect(settings_for(server), name="t") as conn,
    ):
        bucket = await kv.open_bucket(
            conn, kv.LEDGER_BUCKET, observe=lambda v, r: calls.update([(v, r)])
        )
        sink = KvSink(bucket)
        body = {"metadata": {"name": "n1"}, "spec": {"a": 1}, "status": {"x": 1}}
        created = await sink.create(REF, body)
        assert created.body["status"] == {"x": 1}  # kept: one write for a new object
        rv = created.resource_version
        patched = await sink.patch(
            REF, {"metadata": {"resourceVersion": rv}, "status": {"x": 2}}, subresource="status"
        )
        assert calls[("kv_get", "ok")] == 0 and calls[("kv_put", "ok")] == 2
        # The same bytes again: nothing is sent.
        same = await sink.patch(REF, {"status": {"x": 2}}, subresource="status")
        assert same.resource_version == patched.resource_version
        assert calls[("kv_put", "ok")] == 2
        # Someone else writes the key behind the cache's back.
        other = {"metadata": {"name": "n1"}, "spec": {"a": 9}, "status": {"x": 2}}
        await bucket.put(ledger_key(REF), msgspec.json.encode(other))
        stale = {"metadata": {"resourceVersion": patched.resource_version}, "status": {"x": 3}}
        with pytest.raises(errors.Conflict):
            await sink.patch(REF, stale, subresource="status")
        fresh = await sink.get(REF)
        assert fresh is not None and fresh.body["spec"] == {"a": 9}
        stale["metadata"]["resourceVersion"] = fresh.resource_version
        done = await sink.patch(REF, stale, subresource="status")
        assert done.body["spec"] == {"a": 9} and done.body["status"] == {"x": 3}
        # Without a precondition a stale cache costs one re-read, never a refusal.
        await bucket.put(ledger_key(REF), msgspec.json.encode(other))
        free = await sink.patch(REF, {"spec": {"b": 2}})
        assert free.body["spec"] == {"a": 9, "b": 2} and free.body["status"] == {"x": 2}
        found = await bucket.get(ledger_key(REF))
        assert found is not None and int(free.resource_version) == found[1]
        assert msgspec.json.decode(found[0])["spec"] == {"a": 9, "b": 2}


async def test_reconciler_rereads_after_an_external_write_and_a_restart_converges(
    tmp_path: Path,
) -> None:
    async with (
        nats_server(tmp_path) as server,
        connection.connect(settings_for(server), name="t") as conn,
    ):
        bucket = await kv.open_bucket(conn, kv.LEDGER_BUCKET)
        ledger = Ledger()
        ledger.apply(events.DevicesEvent(node="n1", ts=T0, groups=GROUPS))
        first = NodeReconciler(ledger=ledger, sink=KvSink(bucket), metrics=WorkerMetrics())
        await first.prime()
        await first.reconcile("n1")
        # Another writer changes the object: the cached revision is now stale.
        found = await bucket.get(ledger_key(REF))
        assert found is not None
        tampered = msgspec.json.decode(found[0])
        tampered["status"] = {"groups": []}
        tampered["metadata"]["labels"] = {"someone": "else"}
        await bucket.put(ledger_key(REF), msgspec.json.encode(tampered))
        ledger.apply(allocation("n1", 1))
        await first.reconcile("n1")
        want, _ = objects.devices("n1", None, ledger.get("n1"))  # type: ignore[arg-type]
        assert want is not None
        stored = await KvSink(bucket).get(REF)
        assert stored is not None and stored.body["status"] == want.status
        assert stored.body["metadata"]["labels"] == {"someone": "else"}
        # A restarted worker: empty caches, primed from the bucket, converges the same.
        ledger.apply(allocation("n1", 2, "released"))
        second = NodeReconciler(ledger=ledger, sink=KvSink(bucket), metrics=WorkerMetrics())
        await second.prime()
        await second.reconcile("n1")
        want, _ = objects.devices("n1", None, ledger.get("n1"))  # type: ignore[arg-type]
        assert want is not None
        stored = await KvSink(bucket).get(REF)
        assert stored is not None and stored.body["status"] == want.status
        assert await KvSink(bucket).get(Ref(resource=NODEMODELSTORES, name="n1"))
        keys = await bucket.keys()
        assert sorted(keys) == sorted(
            [ledger_key(REF), ledger_key(Ref(resource=NODEMODELSTORES, name="n1"))]
        )


async def test_a_node_that_publishes_before_its_node_exists_is_reconciled_when_it_appears(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as server, fake_api() as (fake, url):
        bus = settings_for(server)
        settings = running.WorkerSettings(
            concurrency=16,
            bus=bus,
            kube=KubeSettings.for_tests(url, backoff_s=0.01),
            https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
            leader=leading.LeaderSettings(
                name="w", namespace="ns", lease_s=1.0, renew_timeout_s=0.6
            ),
            identity="w1",
            resync_s=3600.0,  # only the Node watch can bring the node back within the test
        )
        async with anyio.create_task_group() as tg:
            w: running.Worker = await tg.start(running.run, settings)
            async with connection.connect(bus, name="agent") as conn:
                for e in (
                    events.DevicesEvent(node="late", ts=T0, groups=GROUPS),
                    events.ModelsEvent(node="late", ts=T0, models=()),
                ):
                    await conn.publish(subjects.subject(e.node, events.kind_of(e)), codec.encode(e))
                await conn.flush()

            async def parked() -> bool:
                return w.processor.ledger.is_parked("late")

            await eventually(parked)
            assert (DEVICES_PATH, None, "late") not in fake.objects
            assert (
                w.metrics.count(
                    "gpustack_worker_events_rejected_total", kind="node", reason="unknown_node"
                )
                == 1
            )
            fake.put_object("api/v1/nodes", node("late"))  # the kubelet registers: no new event

            async def reconciled() -> bool:
                devs = fake.objects.get((DEVICES_PATH, None, "late"))
                nms = fake.objects.get(
                    ("apis/worker.gpustack.ai/v1alpha1/nodemodelstores", None, "late")
                )
                return bool(devs and devs.get("status") and nms and nms.get("status"))

            await eventually(reconciled)
            devs = fake.get(DEVICES_PATH, "late")
            assert devs["metadata"]["ownerReferences"][0]["name"] == "late"
            assert not w.processor.ledger.is_parked("late")
            tg.cancel_scope.cancel()


def test_bus_failures_become_errors_the_reconcilers_retry() -> None:
    """A KV write timing out (StateUnavailable) must not escape as a bus error and stop the worker."""
    from bus import errors as bus_errors
    from controlplane import errors as cp_errors

    with (
        pytest.raises(cp_errors.ServerError, match="push: no leader"),
        cp_errors.mapped_bus_errors("push"),
    ):
        raise bus_errors.StateUnavailable("no leader")
    with pytest.raises(cp_errors.Conflict), cp_errors.mapped_bus_errors("push"):
        raise bus_errors.KeyConflict("rev 3")

"""What a new node costs the API: the worker's cold round against the stateful fake API.

The floor the API semantics allow, counted request by request (deterministic, not timed): a
Devices and a NodeModelStore are each a create and a status patch (the API server, and the fake
like it, drops ``status`` on create of a resource with a status subresource); the Node is one
label patch carrying the node reconciler's and the scheduling chain's labels, and one status
patch for its capacity keys; nothing the worker wrote and no Node its informer holds is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import anyio
import anyio.lowlevel
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node
from prometheus_client import CollectorRegistry
from test_controlplane_worker import T0, publish, worker_settings

from bus import events
from bus.devices import DeviceGroup
from bus.testing import eventually, nats_server, settings_for
from controlplane.chain import naming
from controlplane.chain.settings import ChainSettings
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling.nodes import NodeReconciler
from controlplane.reconciling.nodestates import Ledger
from controlplane.reconciling.processing import Processor
from controlplane.reconciling.sinks import Sink
from controlplane.resources import DEVICES, Observed, Resource
from controlplane.worker import running

pytestmark = pytest.mark.anyio
HERE = Path(__file__).parents[1]  # the shared fixtures of tests/controlplane
H200 = msgspec.json.decode(
    (HERE / "controlplane_detect_h200x8.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
NODES = ("n1", "n2", "n3")
CRDS = "/apis/worker.gpustack.ai/v1alpha1"


def _converged(fake: FakeApi) -> bool:
    for n in NODES:
        for plural in ("devices", "nodemodelstores"):
            obj = fake.objects.get((f"apis/worker.gpustack.ai/v1alpha1/{plural}", None, n))
            if not obj or not obj.get("status"):
                return False
        body = fake.get("api/v1/nodes", n)
        labels = body["metadata"].get("labels") or {}
        if labels.get(naming.MANAGED) != "true":  # the chain's
            return False
        if labels.get("acceleratable.feature.gpustack.ai/nvidia") != "true":  # the reconciler's
            return False
        if "nvidia.com/gpu.sliced.units" not in body["status"]["capacity"]:
            return False
    return True


def _sent(fake: FakeApi, node_: str) -> dict[tuple[str, str], int]:
    """The requests naming ``node_``'s objects (the creates name only their collection)."""
    return {
        (method, path): count
        for (method, path), count in fake.paths.items()
        if path.endswith(f"/{node_}") or f"/{node_}/" in path
    }


async def test_a_new_nodes_objects_cost_the_fewest_writes_and_no_read(tmp_path: Path) -> None:
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        for n in NODES:
            fake.put_object("api/v1/nodes", node(n))
        bus = settings_for(server)
        settings = worker_settings(
            bus, url, resync_s=30.0, chain=ChainSettings(fit_coalesce_s=0.05)
        )
        w: running.Worker = await tg.start(running.run, settings)
        # The chain's first pass (after the Node informer's first list: the informer holds every
        # Node, so the reconciler needs no get) labels the Nodes, none of which has an agent yet.
        await eventually(lambda: _true(_chain_passes(w) > 0))
        await publish(bus, [events.DevicesEvent(node=n, ts=T0, groups=H200) for n in NODES])
        await eventually(lambda: _true(_converged(fake)))
        # A few more chain passes: a label the chain left to the reconciler is not written late.
        passes = _chain_passes(w)
        await eventually(lambda: _true(_chain_passes(w) >= passes + 3))
        for n in NODES:
            assert _sent(fake, n) == {
                ("PATCH", f"{CRDS}/devices/{n}/status"): 1,
                ("PATCH", f"{CRDS}/nodemodelstores/{n}/status"): 1,
                # the chain's labels of a Node with no agent yet, then the reconciler's labels
                # and the chain's fit labels in one patch
                ("PATCH", f"/api/v1/nodes/{n}"): 2,
                ("PATCH", f"/api/v1/nodes/{n}/status"): 1,
            }
        assert fake.paths[("POST", f"{CRDS}/devices")] == len(NODES)
        assert fake.paths[("POST", f"{CRDS}/nodemodelstores")] == len(NODES)
        tg.cancel_scope.cancel()


def _chain_passes(w: running.Worker) -> float:
    return w.metrics.count("gpustack_worker_reconcile_seconds_count", kind="chain")


class _Listed:
    """Lists one Devices object, ``old``'s: all :meth:`NodeReconciler.prime` asks of a sink."""

    has_nodes = False
    creates_with_status = True

    async def list(self, resource: Resource) -> list[Observed]:
        body = {"metadata": {"name": "old", "resourceVersion": "1"}}
        return [Observed.of(body)] if resource == DEVICES else []


async def test_an_update_is_taken_before_the_creations_queued_ahead_of_it() -> None:
    ledger, metrics = Ledger(max_nodes=10), WorkerMetrics(CollectorRegistry())
    sink = cast(Sink, _Listed())
    reconciler = NodeReconciler(ledger=ledger, sink=sink, metrics=metrics)
    await reconciler.prime()
    p = Processor(ledger=ledger, reconciler=reconciler, sink=sink, metrics=metrics)
    for n in ("new1", "new2", "old"):  # a cold round's creations, then an existing node's event
        p.ingest(events.DevicesEvent(node=n, ts=T0, groups=H200))
    assert [p.queue.state.take() for _ in range(3)] == ["old", "new1", "new2"]


async def test_reconciles_that_need_no_request_hand_the_loop_back_between_them() -> None:
    ledger, metrics = Ledger(max_nodes=10), WorkerMetrics(CollectorRegistry())
    sink = cast(Sink, _Listed())
    p = Processor(
        ledger=ledger,
        reconciler=NodeReconciler(ledger=ledger, sink=sink, metrics=metrics),
        sink=sink,
        metrics=metrics,
    )
    for i in range(100):  # a resync's nodes, nothing to write for any (no ledger state)
        p.queue.add(f"n{i}")
    async with anyio.create_task_group() as tg:
        tg.start_soon(p.work, 1)
        while p.queue.state.depth == 100:  # prime's list: the worker has not started yet
            await anyio.lowlevel.checkpoint()
        depth = p.queue.state.depth
        tg.cancel_scope.cancel()
    assert depth > 90  # the loop came back after a reconcile, not after all of them


async def _true(value: bool) -> bool:
    return value

"""Events in, reconciles out: the ledger fold, the coalescing queue and the worker tasks.

:meth:`Processor.ingest` runs for every decoded bus event, leader or not (a follower keeps its
ledger warm). :meth:`Processor.work` runs only while this replica leads: ``concurrency`` tasks
take node keys and reconcile them; a key that fails is retried after ``retry_s`` (the ledger
still holds its state). :meth:`Processor.resync` re-queues every known node and, with a
Kubernetes sink, every node whose Node object disappeared, plus orphaned objects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from bus import events
from controlplane import errors
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling.ledger import Ledger, Refused
from controlplane.reconciling.nodes import NodeReconciler
from controlplane.reconciling.queueing import AsyncKeyQueue
from controlplane.resources import DEVICES, NODES
from controlplane.sinks import Sink

__all__ = ["Processor"]

log = logging.getLogger(__name__)


class Processor:
    """Owns the ledger, the queue and the reconciler of the node objects."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        reconciler: NodeReconciler,
        sink: Sink,
        metrics: WorkerMetrics,
        max_keys: int = 20_000,
        retry_s: float = 1.0,
        wallclock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.reconciler = reconciler
        self._sink = sink
        self._metrics = metrics
        self.queue: AsyncKeyQueue[str] = AsyncKeyQueue(max_keys)
        self._overflow: set[str] = set()
        self._since: dict[str, float] = {}
        self._retry_s = retry_s
        self._wallclock = wallclock

    def ingest(self, event: events.Event) -> None:
        """Fold one event and queue its node when its objects may change (never blocks)."""
        kind = events.kind_of(event)
        self._metrics.events.labels(kind=kind).inc()
        try:
            changed = self.ledger.apply(event)
        except Refused as e:
            self._metrics.rejected.labels(kind=kind, reason=e.reason).inc()
            return
        if changed:
            self._since.setdefault(event.node, event.ts.timestamp())
            self._enqueue(event.node)

    def _enqueue(self, node: str) -> None:
        if not self.queue.add(node):
            self._overflow.add(node)
            self._metrics.rejected.labels(kind="node", reason="queue_full").inc()
        self._metrics.queue_depth.set(self.queue.state.depth)

    async def work(self, concurrency: int) -> None:
        """Reconcile queued nodes with ``concurrency`` tasks until cancelled."""
        self.reconciler.forget_cache()
        await self.resync()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(self._worker)

    async def _worker(self) -> None:
        while True:
            node = await self.queue.get()
            try:
                await self.reconciler.reconcile(node)
            except errors.ApiError as e:
                log.warning("node %s: %s; retrying in %.1fs", node, e, self._retry_s)
                self.queue.done(node)
                await anyio.sleep(self._retry_s)
                self._enqueue(node)
                continue
            since = self._since.pop(node, None)
            if since is not None:
                self._metrics.event_to_object_seconds.observe(max(0.0, self._wallclock() - since))
            self.queue.done(node)
            self._metrics.queue_depth.set(self.queue.state.depth)

    async def resync(self) -> None:
        """Queue every node of the ledger, the overflowed ones, and the gone or orphaned ones."""
        nodes = set(self.ledger.nodes()) | self._overflow
        self._overflow.clear()
        if self._sink.has_nodes:
            present = {o.body["metadata"]["name"] for o in await self._sink.list(NODES)}
            for obj in await self._sink.list(DEVICES):
                name = obj.body["metadata"]["name"]
                if name not in present:
                    await self.reconciler.remove(name, reason="node_gone")
        for node in sorted(nodes):
            self._enqueue(node)

    async def resync_every(self, period_s: float) -> None:
        while True:
            await anyio.sleep(period_s)
            try:
                await self.resync()
            except errors.ApiError as e:
                log.warning("resync failed: %s", e)

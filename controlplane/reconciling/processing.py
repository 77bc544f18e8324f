"""Events in, reconciles out: the ledger fold, the coalescing queue and the worker tasks.

:meth:`Processor.ingest` runs for every decoded bus event, leader or not (a follower keeps its
ledger warm). :meth:`Processor.work` runs only while this replica leads: ``concurrency`` tasks
take node keys and reconcile them; a key that fails is retried after ``retry_s`` (the ledger
still holds its state). :meth:`Processor.resync` re-queues every known node and, with a
Kubernetes sink, every node whose Node object disappeared, plus orphaned objects.

Gone Nodes are noticed by :meth:`Processor.node_changed`, a listener of the worker's one Node
informer (``DELETED`` queues the node's removal at once, ``ADDED`` of a node whose state the ledger
parked queues its reconcile, so an agent that published before its Node registered is not
forgotten); the informer's list after a broken watch reports the Nodes deleted meanwhile, and the
periodic resync stays as the safety net (reading Node presence from that informer, so it lists only
the ``Devices``). A removal goes through the queue like a reconcile, so it never runs beside a
reconcile of the same node.

Who hears what is fixed at construction, as typed listeners (never callbacks set afterwards): an
:class:`AllocationListener` (the Pod annotation writer) and a :class:`ModelsListener` (the Pod
event writer) are told every such event that changed the ledger, a :class:`StateListener` (the
scheduling chain's dirty set) the node of every event that changed its state, and
:class:`KnownNodes` (the Node informer) says which Nodes exist. Listeners run on the event loop
inside :meth:`Processor.ingest` and must not block.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.lowlevel

from bus import events
from controlplane import errors
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling.nodes import NodeReconciler
from controlplane.reconciling.nodestates import Ledger, Refused
from controlplane.reconciling.queueing import AsyncKeyQueue
from controlplane.reconciling.sinks import Sink
from controlplane.resources import DEVICES, NODES, Ref

if TYPE_CHECKING:
    from prometheus_client import Counter

__all__ = [
    "AllocationListener",
    "DigestsListener",
    "KnownNodes",
    "LabelsDue",
    "Listeners",
    "ModelsListener",
    "Processor",
    "StateListener",
]

log = logging.getLogger(__name__)


class AllocationListener(Protocol):
    def note(self, event: events.AllocationEvent) -> None:
        """An allocation event changed the ledger."""
        ...


class ModelsListener(Protocol):
    def note(self, event: events.ModelsEvent) -> None:
        """A models event changed the ledger."""
        ...


class StateListener(Protocol):
    def state_changed(self, node: str) -> None:
        """An event changed the ledger state of ``node``."""
        ...


class KnownNodes(Protocol):
    def held(self) -> Collection[str] | None:
        """The Nodes that exist (only membership is asked), or None until known."""
        ...


class DigestsListener(Protocol):
    def models_changed(self, digests: Iterable[str]) -> None:
        """A node's cache changed for these model digests (the ModelArtifact reconciler)."""
        ...


@dataclass(frozen=True, slots=True)
class Listeners:
    """Who the processor tells what (each optional; see the module docstring)."""

    allocations: AllocationListener | None = None
    models_events: ModelsListener | None = None
    digests: DigestsListener | None = None
    states: StateListener | None = None
    known_nodes: KnownNodes | None = None


class LabelsDue:
    """Whether a node reconcile that will patch the Node's labels is queued or running: the
    scheduling chain leaves such a node's labels to it (one patch carries both owners'),
    instead of writing the Node a moment before it. A node waiting to retry after an error
    is not queued, so the chain writes its labels itself then."""

    def __init__(self, queue: AsyncKeyQueue[str], ledger: Ledger) -> None:
        self._queue = queue
        self._ledger = ledger

    def __call__(self, node: str) -> bool:
        if not self._queue.state.holds(node):
            return False
        state = self._ledger.get(node)
        return state is not None and state.groups is not None


class Processor:
    """Owns the ledger, the queue and the reconciler of the node objects."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        reconciler: NodeReconciler,
        sink: Sink,
        metrics: WorkerMetrics,
        retry_s: float = 1.0,
        wallclock: Callable[[], float] = time.time,
        listeners: Listeners = Listeners(),
        queue: AsyncKeyQueue[str] | None = None,
    ) -> None:
        self.ledger = ledger
        self.reconciler = reconciler
        self._sink = sink
        self._metrics = metrics
        self.queue: AsyncKeyQueue[str] = queue if queue is not None else AsyncKeyQueue(20_000)
        """Shared with :class:`LabelsDue` when one is made (pass the same queue to both)."""
        self._overflow: set[str] = set()
        self._gone: set[str] = set()
        self._since: dict[str, float] = {}
        self._retry_s = retry_s
        self._wallclock = wallclock
        self._consumed: dict[str, Counter] = {}
        self._listeners = listeners
        """Fixed for the processor's life; a ``known_nodes`` that says None (before the
        informer's first list) makes the resync list the Nodes itself."""

    def ingest(self, event: events.Event) -> None:
        """Fold one event and queue its node when its objects may change (never blocks).

        Runs for every event on the bus (thousands a second at scale): no logging, and the
        per-kind counter's child is looked up once per kind, not per event.
        """
        kind = events.kind_of(event)
        consumed = self._consumed.get(kind)
        if consumed is None:
            consumed = self._consumed[kind] = self._metrics.events.labels(kind=kind)
        consumed.inc()
        old_models: tuple[events.ModelState, ...] = ()
        if isinstance(event, events.ModelsEvent):
            before = self.ledger.get(event.node)
            old_models = (before.models or ()) if before is not None else ()
        try:
            changed = self.ledger.apply(event)
        except Refused as e:
            self._metrics.rejected.labels(kind=kind, reason=e.reason).inc()
            return
        if changed:
            self._since.setdefault(event.node, event.ts.timestamp())
            self._enqueue(event.node)
            self._tell(event, old_models)

    def _tell(self, event: events.Event, old_models: tuple[events.ModelState, ...]) -> None:
        """The listeners of an event that changed the ledger."""
        heard = self._listeners
        if heard.states is not None:
            heard.states.state_changed(event.node)
        if isinstance(event, events.ModelsEvent):
            if heard.digests is not None:
                digests = {m.digest or m.model for m in (*old_models, *event.models)}
                heard.digests.models_changed(digests)
            if heard.models_events is not None:
                heard.models_events.note(event)
        elif isinstance(event, events.AllocationEvent) and heard.allocations is not None:
            heard.allocations.note(event)

    def _enqueue(self, node: str) -> None:
        """Queue ``node``; a node whose objects exist (an update) in the queue's first lane, so
        a cold round's creations do not starve the events of running nodes."""
        if not self.queue.add(node, first=self.reconciler.has_objects(node)):
            self._overflow.add(node)
            self._metrics.rejected.labels(kind="node", reason="queue_full").inc()
        self._metrics.queue_depth.set(self.queue.state.depth)

    def refresh_node(self, node: str) -> None:
        """Reconcile ``node`` again (its NodeModelStore spec's pins changed)."""
        self._enqueue(node)

    async def work(self, concurrency: int) -> None:
        """Reconcile queued nodes with ``concurrency`` tasks until cancelled."""
        await self.reconciler.prime()
        await self.resync()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(self._worker)

    def node_gone(self, node: str) -> None:
        """The Node object is deleted: queue the removal of the node's objects."""
        self._gone.add(node)
        self._enqueue(node)

    async def _worker(self) -> None:
        while True:
            node = await self.queue.get()
            # Taken now: an event folded while this reconcile runs stamps a new ``since`` and
            # re-queues the node (the queue marks it dirty), so its latency is measured by the
            # reconcile that actually reflects it.
            since = self._since.pop(node, None)
            try:
                if node in self._gone:
                    self._gone.discard(node)
                    await self.reconciler.remove(node, reason="node_gone")
                else:
                    await self.reconciler.reconcile(node)
            except errors.ApiError as e:
                log.warning("node %s: %s; retrying in %.1fs", node, e, self._retry_s)
                if since is not None:
                    self._since[node] = min(since, self._since.get(node, since))
                self.queue.done(node)
                await anyio.sleep(self._retry_s)
                self._enqueue(node)
                continue
            if since is not None:
                self._metrics.event_to_object_seconds.observe(max(0.0, self._wallclock() - since))
            self.queue.done(node)
            self._metrics.queue_depth.set(self.queue.state.depth)
            # A reconcile that needs no request never suspends: without this, a resync of
            # thousands of unchanged nodes would hold the event loop (and the ingest) throughout.
            await anyio.lowlevel.checkpoint()

    async def resync(self) -> None:
        """Queue every node of the ledger, the overflowed ones, and the gone or orphaned ones.

        Which Nodes exist comes from the informer (:class:`KnownNodes`) once it has listed: the
        resync lists only the ``Devices``, to find those of a Node deleted while no worker
        watched. A name the informer lacks is read once before it counts as gone, since the
        informer may not have seen a Node created a moment ago.
        """
        nodes = set(self.ledger.nodes()) | self._overflow
        self._overflow.clear()
        if self._sink.has_nodes:
            informer = self._listeners.known_nodes
            known = informer.held() if informer is not None else None
            present = known if known is not None else await self._listed_nodes()
            for obj in await self._sink.list(DEVICES):
                name = obj.body["metadata"]["name"]
                if name in present:
                    continue
                if (
                    known is not None
                    and await self._sink.get(Ref(resource=NODES, name=name)) is not None
                ):
                    continue
                self._gone.add(name)
                nodes.add(name)
        for node in sorted(nodes):
            self._enqueue(node)

    async def _listed_nodes(self) -> set[str]:
        return {o.body["metadata"]["name"] for o in await self._sink.list(NODES)}

    async def resync_every(self, period_s: float) -> None:
        while True:
            await anyio.sleep(period_s)
            try:
                await self.resync()
            except errors.ApiError as e:
                log.warning("resync failed: %s", e)

    def node_changed(self, kind: str, name: str, body: dict[str, Any]) -> None:
        """A listener of the Node informer (:class:`controlplane.k8s.informing.Informer`).

        ``DELETED`` (seen by the watch, or by a list after the watch was down) queues the
        removal of the node's objects; ``ADDED`` of a node whose state the ledger parked queues
        its reconcile (its state waited for the Node).
        """
        if kind == "DELETED":
            self.node_gone(name)
        elif kind == "ADDED" and self.ledger.is_parked(name):
            self._enqueue(name)

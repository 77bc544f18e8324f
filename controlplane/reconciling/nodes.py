"""The node reconciler: ledger state of one node -> its Devices, NodeModelStore and Node keys.

One key per node, so the objects of a node are never reconciled twice at once (the queue
serializes keys). :meth:`NodeReconciler.reconcile` reads the ledger *now*, so whatever arrived
while the key waited is folded into one write per object. The observed objects are cached as
last written (or read); a 409 re-reads and re-plans (bounded).

:meth:`NodeReconciler.prime` lists the owned objects once (on gaining leadership): afterwards an
object missing from the cache is known to be absent, so a new node's objects are created
(``last=0`` on the KV sink) without a get first; a create that finds the object (someone else
made it) is a 409 like any other, answered with a get and a re-plan.

A node whose Node object does not exist (Kubernetes sink) is rejected and counted and its
objects are deleted, but its ledger state is *parked* (bounded, see
:class:`~controlplane.reconciling.nodestates.Ledger`), so it is reconciled as soon as the Node
appears (the Node watch's ``ADDED``), not only at the agent's next change.

Requests per node, the floor the API allows: the Node is read from the worker's Node informer
(:class:`NodeCache`; a get only for a name it does not hold yet) and what a write returned is
put back into it, so nothing the worker wrote is read again; a new Devices or NodeModelStore is a
create and a status patch (the API server drops ``status`` on create of a resource with a status
subresource); the Node's labels are one patch that carries the scheduling chain's labels too
(:class:`NodeLabeller`), and its capacity one status patch when it changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, Protocol

import anyio
import msgspec

from bus import events, kv, records
from controlplane import errors
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling import applying, labeling, objects
from controlplane.reconciling.nodestates import Ledger, NodeState
from controlplane.reconciling.planning import (
    Action,
    Delete,
    Desired,
    plan,
    plan_node,
    settle_conditions,
)
from controlplane.reconciling.sinks import Sink
from controlplane.resources import DEVICES, NODEMODELSTORES, NODES, Observed, Ref

__all__ = ["NodeReconciler"]

log = logging.getLogger(__name__)

MAX_CONFLICTS: Final = 5
WRITE_GRACE_S: Final = 10.0
_UNKNOWN: Final = object()


class StoreSpecs(Protocol):
    """Where a NodeModelStore's spec comes from (:class:`controlplane.stores.modelstores.ModelStores`)."""

    def spec_for(self, labels: Mapping[str, str], node: str = "") -> dict[str, Any]: ...

    def respec(self, desired: Desired, observed: Observed | None) -> Desired: ...


class NodeCache(Protocol):
    """The Node informer (:class:`controlplane.k8s.informing.Informer`)."""

    def held(self) -> Mapping[str, dict[str, Any]] | None:
        """name -> Node as last listed or watched; None before the first list."""
        ...

    def put(self, body: dict[str, Any]) -> None:
        """This process wrote the Node and the API answered ``body``."""
        ...


class NodeLabeller(Protocol):
    """Another owner of Node labels (the scheduling chain): its patch rides with ours."""

    def label_patch(
        self, body: Mapping[str, Any], state: NodeState | None
    ) -> dict[str, str | None]:
        """The owner's labels that differ on ``body`` (``None`` removes a key)."""
        ...


class NodeReconciler:
    """Makes one node's objects match the ledger. Not safe for two calls on one node at once."""

    def __init__(  # noqa: PLR0913 - keyword-only wiring, each part optional
        self,
        *,
        ledger: Ledger,
        sink: Sink,
        metrics: WorkerMetrics,
        agents: kv.Bucket | None = None,
        store_spec: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], datetime] = events.now,
        store_specs: StoreSpecs | None = None,
        nodes: NodeCache | None = None,
        labeller: NodeLabeller | None = None,
    ) -> None:
        self._ledger = ledger
        self._sink = sink
        self._metrics = metrics
        self._agents = agents
        self._store_spec = store_spec or objects.NMS_SPEC_DEFAULT
        self._observed: dict[Ref, Observed | None] = {}
        self._complete = False
        """Primed: a ref missing from ``_observed`` (and not in ``_reread``) is absent."""
        self._reread: set[Ref] = set()
        self._pushed: dict[str, bytes | None] = {}
        """What was last pushed per node; None: known deleted."""
        self._clock = clock
        self._wallclock = wallclock
        self._store_specs = store_specs
        """The NodeModelStore spec from settings and ModelStores, the user's edits kept."""
        self._nodes = nodes
        self._labeller = labeller

    def forget_pushed(self) -> None:
        """Forget what was pushed to the agents' bucket (the bus may have lost it)."""
        self._pushed.clear()

    def forget_cache(self) -> None:
        """Drop every cached object (on gaining leadership: another replica may have written)."""
        self._observed.clear()
        self._pushed.clear()
        self._complete = False
        self._reread.clear()

    def has_objects(self, node: str) -> bool:
        """The node's Devices or NodeModelStore exists as far as this reconciler knows (listed
        or written): its next reconcile is an update of a write or two, not a creation."""
        return any(
            self._observed.get(Ref(resource=r, name=node)) is not None
            for r in (DEVICES, NODEMODELSTORES)
        )

    async def prime(self) -> None:
        """Cache every owned object with one list each; absent objects then need no get."""
        self.forget_cache()
        for resource in (DEVICES, NODEMODELSTORES):
            for obj in await self._sink.list(resource):
                self._observed[Ref(resource=resource, name=obj.body["metadata"]["name"])] = obj
        self._complete = True

    async def reconcile(self, node: str) -> None:
        state = self._ledger.get(node)
        if state is None:
            return
        started = self._clock()
        uid: str | None = None
        node_obs: Observed | None = None
        if self._sink.has_nodes:
            node_obs = await self._node(node)
            if node_obs is None:
                await self.remove(node, reason="unknown_node")
                return
            self._ledger.unpark(node)
            uid = node_obs.body.get("metadata", {}).get("uid")
        desired, unknown = objects.devices(node, uid, state)
        if unknown:
            self._metrics.rejected.labels(kind="allocations", reason="unknown_device").inc(unknown)
        if desired is not None:
            await self._converge(Ref(resource=DEVICES, name=node), desired)
        await self._converge_store(node, uid, state, node_obs)
        if node_obs is not None and state.groups is not None:
            await self._converge_node(node_obs, node, state.groups)
        self._metrics.reconcile_seconds.labels(kind="node").observe(self._clock() - started)

    async def _converge_store(
        self, node: str, uid: str | None, state: NodeState, node_obs: Observed | None
    ) -> None:
        """The node's NodeModelStore; with :class:`StoreSpecs`, its spec from the settings and
        ModelStores with the user's edits kept, and its status judged against that spec."""
        ref = Ref(resource=NODEMODELSTORES, name=node)
        now, specs = self._wallclock(), self._store_specs
        if specs is None:
            store = objects.node_model_store(node, uid, state, self._store_spec, now=now)
        elif state.models is not None or state.groups is not None:
            labels = (node_obs.body.get("metadata") or {}).get("labels") if node_obs else None
            pure = specs.spec_for(labels or {}, node)
            # The status reads the spec the node runs with (a hand-raised watermark included);
            # the desired spec stays the computed one, which respec records as applied.
            merged = specs.respec(Desired(spec=pure), await self._observe(ref)).spec
            store = objects.node_model_store(node, uid, state, merged, now=now)
            store = msgspec.structs.replace(store, spec=pure) if store is not None else None
        else:
            return
        if store is not None:
            store = await self._converge(ref, store, specs.respec if specs else None)
            await self._push_store_spec(node, store)

    async def remove(self, node: str, *, reason: str) -> None:
        """Delete the node's objects (its Node is gone or not there yet); park its state.

        Counted and logged once per absence, not at every resync of a parked node.
        """
        if not self._ledger.is_parked(node):
            self._metrics.rejected.labels(kind="node", reason=reason).inc()
            log.info("node %s: %s; removing its objects", node, reason)
        for resource in (DEVICES, NODEMODELSTORES):
            ref = Ref(resource=resource, name=node)
            if await self._observe(ref) is not None:
                await self._sink.delete(ref)
            self._observed[ref] = None
        if self._agents is not None and self._pushed.get(node, b"") is not None:
            await self._agents.delete(kv.nms_key(node))
        self._pushed[node] = None
        forgotten = self._ledger.park(node)
        if self._ledger.get(node) is None:
            forgotten.append(node)  # never known (a Node of no agent): keep no cache for it
        for name in forgotten:
            for resource in (DEVICES, NODEMODELSTORES):
                self._observed.pop(Ref(resource=resource, name=name), None)
            self._pushed.pop(name, None)

    async def _converge(
        self,
        ref: Ref,
        desired: Desired,
        respec: Callable[[Desired, Observed | None], Desired] | None = None,
    ) -> Desired:
        """Write ``desired`` (folded with the observed object by ``respec``); return what was
        planned."""
        observed = await self._observe(ref)
        status_on_create = self._sink.creates_with_status
        for _ in range(MAX_CONFLICTS):
            settled = settle_conditions(desired, observed)
            if respec is not None:
                settled = respec(settled, observed)
            try:
                await self._write(plan(ref, settled, observed, status_on_create=status_on_create))
                return settled
            except errors.Conflict:
                self._observed.pop(ref, None)
                self._reread.add(ref)
                observed = await self._observe(ref)
        raise errors.Conflict(409, f"{ref}: still conflicting after {MAX_CONFLICTS} tries")

    async def _write(self, actions: list[Action]) -> None:
        """Run one object's writes to the end even when cancelled meanwhile.

        A create and its status patch are two requests; finishing them under a shield (bounded
        by :data:`WRITE_GRACE_S`) means a cancelled worker never leaves an object without its
        status. Past the bound the writes are abandoned and reported as a temporary error.
        """
        with anyio.move_on_after(WRITE_GRACE_S, shield=True) as scope:
            for action in actions:
                await self._execute(action)
        if scope.cancelled_caught:
            self._observed.pop(actions[0].ref, None)
            self._reread.add(actions[0].ref)
            raise errors.ServerError(0, f"{actions[0].ref}: writes took over {WRITE_GRACE_S}s")

    async def _node(self, node: str) -> Observed | None:
        """The Node from the informer; read only when the informer does not hold it (not
        listed yet, or created a moment ago), so a cold round costs no read per node."""
        held = self._nodes.held() if self._nodes is not None else None
        body = held.get(node) if held is not None else None
        if body is not None:
            return Observed.of(body)
        return await self._sink.get(Ref(resource=NODES, name=node))

    async def _converge_node(self, observed: Observed, node: str, groups: Any) -> None:
        also = None
        if self._labeller is not None:
            also = self._labeller.label_patch(observed.body, self._ledger.get(node))
        actions = plan_node(
            Ref(resource=NODES, name=node),
            observed,
            labels=labeling.labels(groups),
            capacity=labeling.capacity(groups),
            owns_label=labeling.is_owned_label,
            owns_capacity=labeling.is_owned_capacity,
            also=also,
        )
        for action in actions:
            await self._execute(action)

    async def _observe(self, ref: Ref) -> Observed | None:
        cached = self._observed.get(ref, _UNKNOWN)
        if cached is not _UNKNOWN:
            return cached  # type: ignore[return-value]
        if self._complete and ref not in self._reread:
            return None  # primed: not listed, never written since
        found = await self._sink.get(ref)
        self._reread.discard(ref)
        self._observed[ref] = found
        return found

    async def _execute(self, action: Action) -> None:
        """One write through :func:`applying.apply`; the cache follows what the sink returned
        (a failed write is re-read before the next plan). A Node is not cached here: the
        informer holds what the patch returned, so its watch echo is no change."""
        ref = action.ref
        current = self._observed.get(ref)
        try:
            result = await applying.apply(self._sink, action, current)
        except errors.ApiError:
            if not isinstance(action, Delete):
                self._observed.pop(ref, None)
                self._reread.add(ref)
            raise
        if ref.resource != NODES:
            self._observed[ref] = result
        elif self._nodes is not None and result is not None:
            self._nodes.put(result.body)

    async def _push_store_spec(self, node: str, store: Desired) -> None:
        if self._agents is None:
            return
        data = msgspec.json.encode(records.StoreSpecRecord(node=node, spec=store.spec or {}))
        if self._pushed.get(node) != data:
            with errors.mapped_bus_errors("push the store spec"):
                await self._agents.put(kv.nms_key(node), data)
            self._pushed[node] = data

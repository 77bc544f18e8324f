"""The latest state of every node, folded from bus events: what the reconcilers make true.

Pure and synchronous. :meth:`Ledger.apply` folds one event and says whether the node's objects
may need a write; the reconcilers read the ledger when they get to the node, so a burst of N
events for one node costs N cheap folds and one write.

Invariants:

- events are folded in the order they arrive, which is the order the server delivered them
  (:mod:`bus.subscribing` puts retained state at its place in that order). The sender's ``ts``
  orders nothing: a node's clock, or a forged stamp, cannot make an old state win over a newer
  one or lock out the real agent (a far-future stamp is refused before it gets here);
- allocations are keyed by ``allocation_id``; ``released`` removes the entry; at most
  ``max_allocations`` are kept per node (further ones are refused and counted by the caller);
- samples, health and agent events never touch the ledger: samples live on the bus (retained)
  and in metrics, not in etcd;
- a node without a Node object (not registered yet, or deleted) is *parked*: its state is kept,
  so that it can be reconciled the moment the Node appears, without waiting for the agent's
  next change; at most ``max_parked`` nodes are parked, the longest-parked one is forgotten
  first. A parked node still counts against ``max_nodes``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from bus import events
from bus.devices import DeviceGroup, canonical_groups
from controlplane.reconciling.storing import StoreReport

__all__ = ["Ledger", "NodeState", "Refused"]


class Refused(Exception):
    """An event the ledger will not fold; ``reason`` is the metric label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class NodeState:
    """What the control plane knows about one node."""

    groups: tuple[DeviceGroup, ...] | None = None
    """``None`` until the first devices event."""
    models: tuple[events.ModelState, ...] | None = None
    store: StoreReport | None = None
    """The cache-wide figures of the last models event (capacity, stored, used bytes)."""
    allocations: dict[str, events.AllocationEvent] = field(default_factory=dict)


class Ledger:
    """Latest state per node. ``max_nodes`` and ``max_allocations`` bound the memory."""

    def __init__(
        self, *, max_nodes: int = 20_000, max_allocations: int = 4096, max_parked: int = 1024
    ) -> None:
        self._nodes: dict[str, NodeState] = {}
        self._max_nodes = max_nodes
        self._max_allocations = max_allocations
        self._parked: OrderedDict[str, None] = OrderedDict()
        self._max_parked = max_parked

    def __len__(self) -> int:
        return len(self._nodes)

    def nodes(self) -> list[str]:
        return list(self._nodes)

    def get(self, node: str) -> NodeState | None:
        return self._nodes.get(node)

    def all_models(self) -> Iterator[tuple[events.ModelState, ...] | None]:
        """Every node's model cache (None for a node that never sent one)."""
        return (state.models for state in self._nodes.values())

    def park(self, node: str) -> list[str]:
        """Keep ``node``'s state while its Node object is missing; returns the nodes forgotten
        to stay within ``max_parked`` (oldest first). Parking again refreshes nothing: the
        order is when the node was first found missing."""
        if node not in self._nodes or node in self._parked:
            return []
        self._parked[node] = None
        evicted: list[str] = []
        while len(self._parked) > self._max_parked:
            oldest, _ = self._parked.popitem(last=False)
            self._nodes.pop(oldest, None)
            evicted.append(oldest)
        return evicted

    def unpark(self, node: str) -> None:
        """The node's Node object exists (again)."""
        self._parked.pop(node, None)

    def is_parked(self, node: str) -> bool:
        return node in self._parked

    def parked(self) -> list[str]:
        return list(self._parked)

    def apply(self, event: events.Event) -> bool:
        """Fold ``event``; True when the node's objects may have to change.

        :raises Refused: too many nodes, or too many live allocations on one node.
        """
        if not isinstance(event, events.DevicesEvent | events.ModelsEvent | events.AllocationEvent):
            return False
        state = self._nodes.get(event.node)
        if state is None:
            if len(self._nodes) >= self._max_nodes:
                raise Refused("too_many_nodes")
            state = self._nodes[event.node] = NodeState()
        if isinstance(event, events.DevicesEvent):
            return _fold_groups(state, event.groups)
        if isinstance(event, events.ModelsEvent):
            report = StoreReport.of(event)
            changed = event.models != state.models or report != state.store
            state.models, state.store = event.models, report
            return changed
        return _fold_allocation(state, event, self._max_allocations)


def _fold_groups(state: NodeState, received: tuple[DeviceGroup, ...]) -> bool:
    """Keep the canonical form of ``received``: the received tuple itself when it already is
    canonical (an agent sends it so), so that a restatement that reuses it (a recalled event,
    :class:`bus.codec.Guard`) is known unchanged by identity, without ordering or comparing."""
    if received is state.groups:
        return False
    groups = tuple(canonical_groups(received))
    changed = groups != state.groups
    state.groups = received if groups == received else groups
    return changed


def _fold_allocation(state: NodeState, event: events.AllocationEvent, limit: int) -> bool:
    if event.action == "released":
        return state.allocations.pop(event.allocation_id, None) is not None
    if event.allocation_id not in state.allocations and len(state.allocations) >= limit:
        raise Refused("too_many_allocations")
    changed = state.allocations.get(event.allocation_id) != event
    state.allocations[event.allocation_id] = event
    return changed

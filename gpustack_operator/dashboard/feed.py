"""What a page is sent when it opens, before the live events: pure, synchronous state.

The bus retains the latest devices, models and agent record of every node, the last two
samples and a bounded health and allocation history (docs/bus.md). A page that opens needs the
same, plus more recent samples than the bus keeps, to draw its small charts at once. The
:class:`Feed` folds every event the dashboard's subscription delivers into that view, and
:meth:`Feed.replay` gives it back as wire-form events, so the page handles the replay exactly
as it handles live events.

Invariants:

- everything is bounded: ``samples_kept`` samples and ``health_kept`` health events per node,
  the allocations a node holds now (a ``released`` one removes its ``allocated``), at most
  ``max_nodes`` nodes (events of further nodes are passed on live but not kept), and a node
  not heard from for ``max_age_s`` is forgotten, as the bus forgets it;
- the same event delivered twice (the state is read again after a reconnect) is kept once;
- order is the bus's delivery order, never ``ts`` (a forged stamp cannot reorder the view).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from bus import codec, events

__all__ = ["Feed"]

_LAST_VALUE = ("devices", "agent", "models")


@dataclass
class _Node:
    """One node's retained view, each entry the event's wire form."""

    seen: float
    last: dict[str, bytes] = field(default_factory=dict)
    allocations: dict[str, bytes] = field(default_factory=dict)
    health: deque[bytes] = field(default_factory=deque)
    samples: deque[bytes] = field(default_factory=deque)

    def replay(self) -> Iterator[bytes]:
        yield from (self.last[k] for k in _LAST_VALUE if k in self.last)
        yield from self.allocations.values()
        yield from self.health
        yield from self.samples


class Feed:
    """The retained view of every node, fed by :meth:`apply`, read by :meth:`replay`."""

    def __init__(
        self,
        *,
        samples_kept: int = 120,
        health_kept: int = 16,
        max_nodes: int = 2048,
        max_age_s: float = 3600.0,
    ) -> None:
        self.samples_kept = samples_kept
        self.health_kept = health_kept
        self.max_nodes = max_nodes
        self.max_age_s = max_age_s
        self._nodes: dict[str, _Node] = {}

    @property
    def nodes(self) -> list[str]:
        return list(self._nodes)

    def apply(self, event: events.Event, *, now: float) -> bytes:
        """Fold ``event`` (received at monotonic ``now``) into the view; return its wire form."""
        data = codec.encode(event)
        node = self._nodes.get(event.node)
        if node is None:
            if len(self._nodes) >= self.max_nodes:
                return data  # passed on live, not kept: the view stays bounded
            node = self._nodes[event.node] = _Node(seen=now)
        node.seen = now
        if isinstance(event, events.AllocationEvent):
            if event.action == "released":
                node.allocations.pop(event.allocation_id, None)
            else:
                node.allocations[event.allocation_id] = data
        elif isinstance(event, events.HealthEvent):
            _keep(node.health, data, self.health_kept)
        elif isinstance(event, events.SamplesEvent):
            _keep(node.samples, data, self.samples_kept)
        else:
            node.last[events.kind_of(event)] = data
        return data

    def expire(self, *, now: float) -> list[str]:
        """Forget the nodes not heard from for ``max_age_s``; return their names."""
        gone = [name for name, n in self._nodes.items() if now - n.seen > self.max_age_s]
        for name in gone:
            del self._nodes[name]
        return gone

    def replay(self) -> list[bytes]:
        """Every kept event, node by node: last values, allocations held, health, samples."""
        return [data for node in self._nodes.values() for data in node.replay()]


def _keep(history: deque[bytes], data: bytes, limit: int) -> None:
    """Append ``data`` unless it is already there (a re-read of the retained state)."""
    if data in history:
        return
    history.append(data)
    while len(history) > limit:
        history.popleft()

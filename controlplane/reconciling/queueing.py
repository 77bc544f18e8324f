"""A bounded per-key work queue with coalescing and per-key serialization.

:class:`KeyQueue` is the pure state machine; :class:`AsyncKeyQueue` adds waiting. A key is in
exactly one of three places: *pending* (waiting for a worker), *in flight* (a worker has it), or
*in flight and dirty* (new work arrived meanwhile). Hence:

- coalescing: adding a pending key does nothing, so N events for one node are one reconcile;
- serialization: a key is never handed to two workers; work arriving while it is in flight
  re-queues it when :meth:`KeyQueue.done` is called, so the newest state is always reconciled;
- bounded: at most ``max_keys`` distinct keys; :meth:`KeyQueue.add` refuses a new key beyond
  that (the caller counts it and a later resync re-adds it — the state itself lives in the ledger,
  so nothing is lost, only delayed);
- two lanes: a key added with ``first=True`` (a node whose objects exist: an update, a write or
  two) is taken before the others (a node's first creation, several writes), so the events of
  running nodes are not starved behind a cold round of thousands of creations; after
  :data:`FAIR` first-lane keys in a row one other is taken, so neither lane starves the other.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Final, Generic, TypeVar

import anyio

__all__ = ["AsyncKeyQueue", "KeyQueue"]

K = TypeVar("K", bound=Hashable)

FAIR: Final = 4
"""First-lane keys taken in a row before one of the other lane (when both wait)."""


class KeyQueue(Generic[K]):
    """Pending keys in arrival order, keys in flight, and which of those got new work."""

    def __init__(self, max_keys: int) -> None:
        self._first: OrderedDict[K, None] = OrderedDict()
        self._pending: OrderedDict[K, None] = OrderedDict()
        self._in_flight: set[K] = set()
        self._dirty: dict[K, bool] = {}
        """In flight and dirty -> the lane it goes back to (``first``)."""
        self._streak = 0
        self._max_keys = max_keys

    @property
    def depth(self) -> int:
        """Keys waiting for a worker (pending, plus in flight and dirty)."""
        return len(self._first) + len(self._pending) + len(self._dirty)

    def __len__(self) -> int:
        return len(self._first) + len(self._pending) + len(self._in_flight)

    def holds(self, key: K) -> bool:
        """``key`` is pending or in flight: a worker will (or does) handle it."""
        return key in self._first or key in self._pending or key in self._in_flight

    def add(self, key: K, *, first: bool = False) -> bool:
        """Queue ``key`` (in the first lane with ``first``); False when it is new and the queue
        is full (nothing queued). A key already pending stays where it waits."""
        if key in self._in_flight:
            self._dirty[key] = first
            return True
        if key in self._first or key in self._pending:
            return True
        if len(self) >= self._max_keys:
            return False
        (self._first if first else self._pending)[key] = None
        return True

    def take(self) -> K | None:
        """The oldest key of the first lane (of the other after :data:`FAIR` in a row), now in
        flight; None when nothing is pending."""
        lane = self._first if self._first and self._streak < FAIR else self._pending
        if not lane:
            lane = self._first
        if not lane:
            return None
        self._streak = self._streak + 1 if lane is self._first else 0
        key, _ = lane.popitem(last=False)
        self._in_flight.add(key)
        return key

    def done(self, key: K) -> bool:
        """Mark ``key`` finished; True when it went back to pending (work arrived meanwhile)."""
        self._in_flight.discard(key)
        if key in self._dirty:
            first = self._dirty.pop(key)
            (self._first if first else self._pending)[key] = None
            return True
        return False


class AsyncKeyQueue(Generic[K]):
    """:class:`KeyQueue` with an awaitable :meth:`get` for worker tasks."""

    def __init__(self, max_keys: int) -> None:
        self.state: KeyQueue[K] = KeyQueue(max_keys)
        self._ready = anyio.Event()

    def add(self, key: K, *, first: bool = False) -> bool:
        queued = self.state.add(key, first=first)
        self._ready.set()
        return queued

    async def get(self) -> K:
        """Wait for a pending key and take it (the caller must call :meth:`done`)."""
        while True:
            key = self.state.take()
            if key is not None:
                return key
            if self._ready.is_set():
                self._ready = anyio.Event()
            await self._ready.wait()

    def done(self, key: K) -> None:
        if self.state.done(key):
            self._ready.set()

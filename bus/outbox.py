"""The publisher's queue: a bounded outbox, as a pure synchronous data structure.

Two parts with different loss rules (see :mod:`bus.publishing` for how they are sent):

- **samples**: a FIFO of ``max_samples``; when full, :meth:`Outbox.put` drops the oldest and
  returns it, so the caller can count it (a fresher sample is worth more than an old one);
- **state events**: keyed by ``(subject, state_key)`` and coalesced (a newer event for a key
  replaces the queued one), so the outbox is bounded by the number of keys, never by time.

No I/O and no awaits: it exists before any connection and outlives every one of them.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import msgspec

from bus import codec, events, subjects

__all__ = ["Key", "Outbox", "Pending"]

Key = tuple[str, str]
"""A state event's identity: ``(subject, state_key)``."""


class Pending(msgspec.Struct, frozen=True):
    """An encoded event waiting to be sent. Identity matters: see :meth:`Outbox.acked`."""

    subject: str
    payload: bytes
    kind: subjects.Kind


class Outbox:
    """The publisher's queue, as a pure synchronous data structure (no I/O, no awaits).

    State events wait in one *lane* per subject, oldest first, coalesced per key (a newer event
    for a key replaces the queued one and moves to the back: it is the newest). Each subject has
    at most one event *in flight* (sent, acknowledgement awaited); :meth:`take` hands out the
    head of a lane whose subject has none, :meth:`acked` and :meth:`failed` end the flight. So
    events of one subject reach the stream in the order they were published (minus the
    coalesced ones), and an older state can never be stored after a newer one; subjects are
    independent of each other.
    """

    def __init__(self, *, max_samples: int) -> None:
        self._samples: deque[Pending] = deque()
        self._max_samples = max_samples
        self._lanes: dict[str, OrderedDict[str, Pending]] = {}
        self._queued = 0
        self._ready: OrderedDict[str, None] = OrderedDict()
        """Subjects with a queued event and nothing in flight, in the order they became so."""
        self._inflight: dict[str, tuple[str, Pending]] = {}

    def __len__(self) -> int:
        """Events accepted and not yet stored (state) or handed to the server (samples)."""
        return len(self._samples) + self._queued + len(self._inflight)

    @property
    def ready(self) -> int:
        """Subjects whose next state event :meth:`take` can hand out now."""
        return len(self._ready)

    @property
    def inflight(self) -> int:
        """State events sent whose acknowledgement is awaited (one per subject at most)."""
        return len(self._inflight)

    @property
    def has_states(self) -> bool:
        return bool(self._queued or self._inflight)

    def put(self, event: events.Event) -> Pending | None:
        """Queue ``event``; return the sample it pushed out, if any.

        :raises InvalidNodeName: the event's node cannot be put in a subject.
        """
        kind = events.kind_of(event)
        item = Pending(subjects.subject(event.node, kind), codec.encode(event), kind)
        if kind == "samples":
            self._samples.append(item)
            if len(self._samples) > self._max_samples:
                return self._samples.popleft()
            return None
        lane = self._lanes.setdefault(item.subject, OrderedDict())
        key = events.state_key(event)
        if lane.pop(key, None) is None:
            self._queued += 1
        lane[key] = item  # at the back: the newest
        if item.subject not in self._inflight:
            self._ready.setdefault(item.subject)
        return None

    def take(self) -> tuple[Key, Pending] | None:
        """The oldest event of the longest-waiting ready subject, now in flight; or None."""
        if not self._ready:
            return None
        subject, _ = self._ready.popitem(last=False)
        lane = self._lanes[subject]
        key, item = lane.popitem(last=False)
        self._queued -= 1
        if not lane:
            del self._lanes[subject]
        self._inflight[subject] = (key, item)
        return (subject, key), item

    def acked(self, key: Key, item: Pending) -> None:
        """``item`` was stored: forget it; the subject's next event becomes ready."""
        if self._end_flight(key, item) and key[0] in self._lanes:
            self._ready[key[0]] = None

    def failed(self, key: Key, item: Pending) -> None:
        """``item`` may not be stored: it goes back to the head of its lane (it is older than
        everything there), unless a newer event of its key replaced it; retried first."""
        subject, skey = key
        if not self._end_flight(key, item):
            return
        lane = self._lanes.setdefault(subject, OrderedDict())
        if skey not in lane:
            lane[skey] = item
            lane.move_to_end(skey, last=False)
            self._queued += 1
        self._ready[subject] = None
        self._ready.move_to_end(subject, last=False)

    def _end_flight(self, key: Key, item: Pending) -> bool:
        flight = self._inflight.get(key[0])
        if flight is None or flight[1] is not item:
            return False
        del self._inflight[key[0]]
        return True

    def states(self) -> list[tuple[Key, Pending]]:
        """The latest unstored event of every key (queued, then in flight), for inspection."""
        queued = [((s, k), p) for s, lane in self._lanes.items() for k, p in lane.items()]
        flying = [
            ((s, k), p) for s, (k, p) in self._inflight.items() if k not in self._lanes.get(s, {})
        ]
        return [*queued, *flying]

    def peek_sample(self) -> Pending | None:
        return self._samples[0] if self._samples else None

    def pop_sample(self, item: Pending) -> None:
        """Remove ``item`` if it is still the head (it may have been pushed out meanwhile)."""
        if self._samples and self._samples[0] is item:
            self._samples.popleft()

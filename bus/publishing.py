"""Events -> NATS, through a bounded outbox that rides out disconnections.

:meth:`Publisher.publish` never blocks and never waits for the network: it puts the encoded
event into an :class:`Outbox` and wakes the sender task. The outbox has two parts with different
loss rules:

- **samples** go into a FIFO of ``settings.outbox_size``; when full, the oldest is dropped and
  counted (a fresher sample is worth more than an old one). They are published fire-and-forget.
- **state events** (devices, health, allocations, models, agent) are keyed by
  ``(subject, state_key)`` and coalesced: a newer event for a key replaces the queued one, so the
  outbox is bounded by the number of keys, never by time disconnected. They are published with a
  JetStream acknowledgement and leave the outbox only once stored; a failure keeps them for the
  next try. Hence: the latest state of every key always reaches the server eventually.

State events are pipelined: up to ``settings.publish_window`` acknowledgements are awaited at
once, but **at most one per subject** (see :class:`Outbox`). Events published on a subject while
one of its events is in flight wait (coalescing further) until that one is acknowledged or
failed, so events of one subject are stored in publication order and an older state never
overtakes a newer one. Different subjects (nodes, kinds) proceed in parallel.

Shutdown (also by cancellation) stops the sender, then flushes the outbox for at most
``drain_timeout_s``, shielded from cancellation. After that, :meth:`Publisher.publish` raises
:class:`~bus.errors.PublisherClosed`: nothing is accepted that nobody would send.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import anyio
import msgspec

from bus import acking, codec, events, state, subjects
from bus.acking import AckWindow, OnDone
from bus.connection import Connection
from bus.errors import BusError, NotConnected, PublisherClosed, PublishFailed, StateUnavailable
from bus.metrics import BusMetrics
from bus.settings import BusSettings

__all__ = ["Key", "Outbox", "Pending", "Publisher", "publisher"]

log = logging.getLogger(__name__)

_MAX_RETRY_S: Final = 2.0

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


class Publisher:
    """Publishes events for one process; create with :func:`publisher`."""

    def __init__(
        self, conn: Connection, settings: BusSettings, metrics: BusMetrics, acks: AckWindow
    ) -> None:
        self._conn = conn
        self._acks = acks
        self._settings = settings
        self._metrics = metrics
        self._outbox = Outbox(max_samples=settings.outbox_size)
        self._window = max(1, settings.publish_window)
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._streams_ready = False
        self._closed = False
        self._failure: BusError | None = None

    @property
    def pending(self) -> int:
        """Events not yet handed to (samples) or stored by (state events) the server."""
        return len(self._outbox)

    @property
    def closed(self) -> bool:
        """True once :func:`publisher` has exited; :meth:`publish` then raises."""
        return self._closed

    def publish(self, event: events.Event) -> None:
        """Queue ``event`` for sending; returns at once.

        :raises InvalidNodeName: the event's node cannot be put in a subject.
        :raises PublisherClosed: the publisher has shut down (the event is not accepted).
        """
        if self._closed:
            raise PublisherClosed(f"publisher closed; {events.kind_of(event)} event not accepted")
        dropped = self._outbox.put(event)
        if dropped is not None:
            self._metrics.outbox_dropped.labels(kind=dropped.kind).inc()
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        self._wake.set()

    def close(self) -> None:
        """Refuse further events; log what is left unsent (it is lost with the process)."""
        self._closed = True
        if self.pending:
            log.warning("bus publisher stopped with %d events unsent", self.pending)

    async def wait_sent(self) -> None:
        """Wait until the outbox is empty (everything stored or handed to the server)."""
        await self._idle.wait()

    async def run(self) -> None:
        """The sender loop; runs until cancelled."""
        failures = 0
        while True:
            if not self._outbox:
                self._idle.set()
                await self._wake.wait()
            self._wake = anyio.Event()
            if await self._send_all():
                failures = 0
                continue
            failures += 1
            # Back off while disconnected; a publish() in the meantime does not cut the wait short.
            await self._backoff(failures)

    async def drain(self) -> None:
        """Send until the outbox is empty, retrying with backoff; callers bound the time."""
        failures = 0
        while self._outbox:
            if await self._send_all():
                failures = 0
            else:
                failures += 1
                await self._backoff(failures)
        self._idle.set()

    async def _backoff(self, failures: int) -> None:
        await anyio.sleep(min(self._settings.reconnect_wait_s * failures, _MAX_RETRY_S))

    async def _send_all(self) -> bool:
        """Send what is queued: state events first. Returns False on the first failure."""
        try:
            if not self._streams_ready and self._outbox.has_states:
                await state.ensure_streams(self._conn, self._settings)
                self._streams_ready = True
            failure = await self._send_states()
            if failure is not None:
                raise failure
            while (sample := self._outbox.peek_sample()) is not None:
                await self._conn.publish(sample.subject, sample.payload)
                self._outbox.pop_sample(sample)
                self._metrics.published.labels(kind="samples").inc()
        except (PublishFailed, StateUnavailable) as e:
            # A missing stream (server store wiped, failover) looks like this: recreate next time.
            self._streams_ready = False
            log.debug("publish failed, will retry: %s", e)
            return False
        except NotConnected:
            return False
        return True

    async def _send_states(self) -> BusError | None:
        """Keep up to ``publish_window`` acknowledgements in flight until none is left.

        Returns the first failure seen in this round (the caller backs off), else None.
        """
        self._failure = None
        while self._failure is None:
            if self._outbox.inflight < self._window and (taken := self._outbox.take()):
                key, item = taken
                try:
                    await self._acks.send(item.subject, item.payload, self._landing(key, item))
                except BaseException:  # not sent (or cancelled while sending): keep it
                    self._outbox.failed(key, item)
                    raise
                continue
            if not self._outbox.inflight:
                break
            self._wake = anyio.Event()  # set by an acknowledgement or a publish()
            with anyio.move_on_after(self._acks.next_deadline() - anyio.current_time()):
                await self._wake.wait()
            self._acks.expire(anyio.current_time())
        return self._failure

    def _landing(self, key: Key, item: Pending) -> OnDone:
        def landed(failure: BusError | None) -> None:
            if failure is None:
                self._outbox.acked(key, item)
                self._metrics.published.labels(kind=item.kind).inc()
            else:
                self._outbox.failed(key, item)
                self._failure = self._failure or failure
            self._wake.set()

        return landed


@asynccontextmanager
async def publisher(
    conn: Connection, *, settings: BusSettings, metrics: BusMetrics
) -> AsyncIterator[Publisher]:
    """Run a :class:`Publisher` while inside; on exit, flush it within ``drain_timeout_s``.

    The flush runs after the sender task stopped and is shielded, so it also happens when the
    exit is a cancellation. Events still queued when the bound expires are logged and lost with
    the process; :meth:`Publisher.publish` raises :class:`PublisherClosed` from then on.
    """
    async with acking.ack_window(conn, timeout_s=settings.request_timeout_s) as acks:
        pub = Publisher(conn, settings, metrics, acks)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pub.run, name="bus-publisher")
                try:
                    yield pub
                finally:
                    tg.cancel_scope.cancel()
        finally:
            with anyio.move_on_after(settings.drain_timeout_s, shield=True):
                await pub.drain()
            pub.close()

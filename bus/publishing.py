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

Shutdown tries to empty the outbox within ``drain_timeout_s``, shielded from cancellation.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import anyio
import msgspec

from bus import codec, events, state, subjects
from bus.connection import Connection
from bus.errors import NotConnected, PublishFailed, StateUnavailable
from bus.metrics import BusMetrics
from bus.settings import BusSettings

__all__ = ["Outbox", "Pending", "Publisher", "publisher"]

log = logging.getLogger(__name__)

_MAX_RETRY_S: Final = 2.0


class Pending(msgspec.Struct, frozen=True):
    """An encoded event waiting to be sent. Identity matters: see :meth:`Outbox.sent`."""

    subject: str
    payload: bytes
    kind: subjects.Kind


class Outbox:
    """The publisher's queue, as a pure synchronous data structure (no I/O, no awaits)."""

    def __init__(self, *, max_samples: int) -> None:
        self._samples: deque[Pending] = deque()
        self._max_samples = max_samples
        self._states: OrderedDict[tuple[str, str], Pending] = OrderedDict()

    def __len__(self) -> int:
        return len(self._samples) + len(self._states)

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
        key = (item.subject, events.state_key(event))
        self._states.pop(key, None)  # re-insert at the end: newest last
        self._states[key] = item
        return None

    def states(self) -> list[tuple[tuple[str, str], Pending]]:
        """A copy of the queued state events, oldest first."""
        return list(self._states.items())

    def sent(self, key: tuple[str, str], item: Pending) -> None:
        """Forget ``item`` after it was stored, unless a newer event replaced it meanwhile."""
        if self._states.get(key) is item:
            del self._states[key]

    def peek_sample(self) -> Pending | None:
        return self._samples[0] if self._samples else None

    def pop_sample(self, item: Pending) -> None:
        """Remove ``item`` if it is still the head (it may have been pushed out meanwhile)."""
        if self._samples and self._samples[0] is item:
            self._samples.popleft()


class Publisher:
    """Publishes events for one process; create with :func:`publisher`."""

    def __init__(self, conn: Connection, settings: BusSettings, metrics: BusMetrics) -> None:
        self._conn = conn
        self._settings = settings
        self._metrics = metrics
        self._outbox = Outbox(max_samples=settings.outbox_size)
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._streams_ready = False

    @property
    def pending(self) -> int:
        """Events not yet handed to (samples) or stored by (state events) the server."""
        return len(self._outbox)

    def publish(self, event: events.Event) -> None:
        """Queue ``event`` for sending; returns at once.

        :raises InvalidNodeName: the event's node cannot be put in a subject.
        """
        dropped = self._outbox.put(event)
        if dropped is not None:
            self._metrics.outbox_dropped.labels(kind=dropped.kind).inc()
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        self._wake.set()

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
            await anyio.sleep(min(self._settings.reconnect_wait_s * failures, _MAX_RETRY_S))

    async def _send_all(self) -> bool:
        """Send what is queued: state events first. Returns False on the first failure."""
        try:
            if not self._streams_ready and self._outbox.states():
                await state.ensure_streams(self._conn, self._settings)
                self._streams_ready = True
            for key, item in self._outbox.states():
                await self._conn.publish_acked(item.subject, item.payload)
                self._outbox.sent(key, item)
                self._metrics.published.labels(kind=item.kind).inc()
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


@asynccontextmanager
async def publisher(
    conn: Connection, *, settings: BusSettings, metrics: BusMetrics
) -> AsyncIterator[Publisher]:
    """Run a :class:`Publisher` while inside; on exit, flush it within ``drain_timeout_s``.

    Events still queued when the bound expires are logged and lost with the process.
    """
    pub = Publisher(conn, settings, metrics)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pub.run, name="bus-publisher")
        try:
            yield pub
        finally:
            with anyio.move_on_after(settings.drain_timeout_s, shield=True):
                await pub.wait_sent()
            if pub.pending:
                log.warning("bus publisher stopped with %d events unsent", pub.pending)
            tg.cancel_scope.cancel()

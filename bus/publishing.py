"""Events -> NATS, through a bounded outbox that exists before the connection and outlives it.

A :class:`Publisher` is created without a connection. :meth:`Publisher.publish` never blocks and
never waits for the network: it puts the encoded event into the :class:`~bus.outbox.Outbox` and
wakes the sender, if there is one. While no connection is attached the events just wait there,
under the outbox's loss rules:

- **samples** are kept up to ``settings.outbox_size``; beyond that the oldest is dropped and
  counted (``gpustack_bus_outbox_dropped_events_total``). They are published fire-and-forget.
- **state events** (devices, health, allocations, models, agent) are coalesced per
  ``(subject, state_key)``, so they are bounded by the number of keys, never by time
  disconnected. They are published with a JetStream acknowledgement and leave the outbox only
  once stored; a failure keeps them for the next try. Hence: the latest state of every key
  always reaches the server eventually, whenever that server first becomes reachable.

:meth:`Publisher.attach` sends through one connection while its block runs; :func:`link`
connects (retrying forever) and stays attached until cancelled. So a process creates its
publisher first, hands ``publish`` to its parts, and lets the link come up whenever NATS does.

State events are pipelined: up to ``settings.publish_window`` acknowledgements are awaited at
once, but **at most one per subject** (see :class:`~bus.outbox.Outbox`). Events published on a
subject while one of its events is in flight wait (coalescing further) until that one is
acknowledged or failed, so events of one subject are stored in publication order and an older
state never overtakes a newer one. Different subjects (nodes, kinds) proceed in parallel.

A reconnect may reach a server that lost everything (restarted with an empty store): the
outbox is empty by then, since everything was stored before. So after every reconnect the
publisher re-ensures the streams before its next state event and calls the callbacks given to
:meth:`Publisher.on_reconnect`, with which each part publishes its whole current state again
(a few coalesced events per node), instead of leaving the bus without it until a periodic
resync.

Leaving an attachment (also by cancellation) stops the sender, then flushes the outbox for at
most ``drain_timeout_s``, shielded from cancellation; what is left stays queued for the next
connection. Leaving :func:`publisher` closes the publisher: from then on :meth:`Publisher.publish`
raises :class:`~bus.errors.PublisherClosed`: nothing is accepted that nobody would send.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    nullcontext,
)
from typing import Final

import anyio

from bus import acking, events, state
from bus.acking import AckWindow, OnDone
from bus.connection import Connection, connect
from bus.errors import BusError, NotConnected, PublisherClosed, PublishFailed, StateUnavailable
from bus.metrics import BusMetrics
from bus.outbox import Key, Outbox, Pending
from bus.presence import Presence
from bus.settings import BusSettings
from kit import backoff

__all__ = ["Publisher", "link", "publisher"]

log = logging.getLogger(__name__)

_MAX_RETRY_S: Final = 2.0


class Publisher:
    """Publishes events for one process; create with :func:`publisher`, no connection needed."""

    def __init__(
        self, settings: BusSettings, metrics: BusMetrics, *, ensure_streams: bool = True
    ) -> None:
        """:param ensure_streams: create the retention streams before the first state event;
        False for the agents, which may not (only the worker administers streams, see
        :mod:`bus.identity`): their state events wait in the outbox until the streams exist."""
        self._settings = settings
        self._ensure_streams = ensure_streams
        self._metrics = metrics
        self._outbox = Outbox(max_samples=settings.outbox_size)
        self._window = max(1, settings.publish_window)
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._attached = False
        self._streams_ready = False
        self._closed = False
        self._failure: BusError | None = None
        self._republishers: list[Callable[[], None]] = []

    @property
    def pending(self) -> int:
        """Events not yet handed to (samples) or stored by (state events) the server."""
        return len(self._outbox)

    @property
    def attached(self) -> bool:
        """True while a connection is attached (:meth:`attach`), connected or reconnecting."""
        return self._attached

    @property
    def closed(self) -> bool:
        """True once :func:`publisher` has exited; :meth:`publish` then raises."""
        return self._closed

    def publish(self, event: events.Event) -> None:
        """Queue ``event`` for sending; returns at once, attached or not.

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

    def on_reconnect(self, republish: Callable[[], None]) -> None:
        """Call ``republish()`` after every reconnect of an attached connection.

        ``republish`` publishes its owner's whole current state again (through :meth:`publish`)
        for a server that may have lost it; it must not block. Register once, at start.
        """
        self._republishers.append(republish)

    def _reconnected(self) -> None:
        self._streams_ready = False  # the server may be new, or restarted without its store
        for republish in self._republishers:
            try:
                republish()
            except BusError as e:  # refused (closing): the others may still publish
                log.warning("republishing after a reconnect failed: %s", e)
        self._wake.set()

    async def _on_reconnects(self, conn: Connection) -> None:
        async def reconnected() -> None:
            self._reconnected()

        await conn.every_reconnect(reconnected)

    def close(self) -> None:
        """Refuse further events; log what is left unsent (it is lost with the process)."""
        self._closed = True
        if self.pending:
            log.warning("bus publisher stopped with %d events unsent", self.pending)

    async def wait_sent(self) -> None:
        """Wait until the outbox is empty (everything stored or handed to the server)."""
        await self._idle.wait()

    @asynccontextmanager
    async def attach(self, conn: Connection) -> AsyncIterator[None]:
        """Send through ``conn`` while inside, what was queued before first.

        On exit (also by cancellation) the sender stops, then the outbox is flushed within
        ``drain_timeout_s`` (shielded); what is still unsent stays queued for the next attach.

        :raises PublisherClosed: the publisher has shut down.
        :raises RuntimeError: another connection is attached.
        """
        if self._closed:
            raise PublisherClosed("publisher closed; cannot attach")
        if self._attached:
            raise RuntimeError("publisher already attached to a connection")
        self._attached = True
        self._streams_ready = False  # another connection may reach another server
        try:
            async with acking.ack_window(conn, timeout_s=self._settings.request_timeout_s) as acks:
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._run, conn, acks, name="bus-publisher")
                        tg.start_soon(self._on_reconnects, conn, name="bus-republish")
                        try:
                            yield
                        finally:
                            tg.cancel_scope.cancel()
                finally:
                    with anyio.move_on_after(self._settings.drain_timeout_s, shield=True):
                        await self._drain(conn, acks)
        finally:
            self._attached = False

    async def _run(self, conn: Connection, acks: AckWindow) -> None:
        """The sender loop of one attachment; runs until cancelled."""
        failures = 0
        while True:
            if not self._outbox:
                self._idle.set()
                await self._wake.wait()
            self._wake = anyio.Event()
            if await self._send_all(conn, acks):
                failures = 0
                continue
            failures += 1
            # Back off while disconnected; a publish() in the meantime does not cut the wait short.
            await self._backoff(failures)

    async def _drain(self, conn: Connection, acks: AckWindow) -> None:
        """Send until the outbox is empty, retrying with backoff; callers bound the time."""
        failures = 0
        while self._outbox:
            if await self._send_all(conn, acks):
                failures = 0
            else:
                failures += 1
                await self._backoff(failures)
        self._idle.set()

    async def _backoff(self, failures: int) -> None:
        first = self._settings.reconnect_wait_s
        await anyio.sleep(backoff.delay(failures, first_s=first, max_s=_MAX_RETRY_S))

    async def _send_all(self, conn: Connection, acks: AckWindow) -> bool:
        """Send what is queued: state events first. Returns False on the first failure."""
        try:
            if self._ensure_streams and not self._streams_ready and self._outbox.has_states:
                await state.ensure_streams(conn, self._settings)
                self._streams_ready = True
            failure = await self._send_states(acks)
            if failure is not None:
                raise failure
            while (sample := self._outbox.peek_sample()) is not None:
                await conn.publish(sample.subject, sample.payload)
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

    async def _send_states(self, acks: AckWindow) -> BusError | None:
        """Keep up to ``publish_window`` acknowledgements in flight until none is left.

        Returns the first failure seen in this round (the caller backs off), else None.
        """
        self._failure = None
        while self._failure is None:
            if self._outbox.inflight < self._window and (taken := self._outbox.take()):
                key, item = taken
                try:
                    await acks.send(item.subject, item.payload, self._landing(key, item))
                except BaseException:  # not sent (or cancelled while sending): keep it
                    self._outbox.failed(key, item)
                    raise
                continue
            if not self._outbox.inflight:
                break
            self._wake = anyio.Event()  # set by an acknowledgement or a publish()
            with anyio.move_on_after(acks.next_deadline() - anyio.current_time()):
                await self._wake.wait()
            acks.expire(anyio.current_time())
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
    conn: Connection | None = None,
    *,
    settings: BusSettings,
    metrics: BusMetrics,
    ensure_streams: bool = True,
) -> AsyncIterator[Publisher]:
    """A :class:`Publisher`, open while inside and closed on exit.

    With ``conn`` it is attached to it for the whole block (:meth:`Publisher.attach`: flushed
    within ``drain_timeout_s`` on the way out, also on cancellation); without, it queues until
    :meth:`Publisher.attach` or :func:`link` gives it a connection. On exit, events still queued
    are logged and lost with the process; :meth:`Publisher.publish` raises
    :class:`PublisherClosed` from then on. ``ensure_streams``: see :class:`Publisher`.
    """
    pub = Publisher(settings, metrics, ensure_streams=ensure_streams)
    attached: AbstractAsyncContextManager[None] = (
        pub.attach(conn) if conn is not None else nullcontext()
    )
    try:
        async with attached:
            yield pub
    finally:
        pub.close()


async def link(
    pub: Publisher,
    settings: BusSettings,
    *,
    name: str | None = None,
    also: Sequence[Callable[[Connection], AbstractAsyncContextManager[object]]] = (),
    presence: Presence | None = None,
) -> None:
    """Connect (retrying forever), then keep ``pub`` attached until cancelled.

    Run it as a task beside the parts that publish: they never wait for it. Cancelling it
    flushes the outbox within ``drain_timeout_s`` (:meth:`Publisher.attach`), then drains and
    closes the connection. Once connected, a lost connection is replaced (for ever, see
    :mod:`bus.connection`), and the outbox holds everything meanwhile. ``also`` attaches other
    users of the same connection (e.g. :meth:`bus.accessreviews.BusReviewer.attach`) for as long.
    ``presence`` is told when the connection is up and lost (the process's ``/livez``).
    """
    async with (
        connect(settings, name=name, presence=presence) as conn,
        pub.attach(conn),
        AsyncExitStack() as stack,
    ):
        for attach in also:
            await stack.enter_async_context(attach(conn))
        await anyio.sleep_forever()

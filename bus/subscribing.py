"""NATS -> typed events: a subscription is an async iterator of :data:`bus.events.Event`.

Raw messages are handed from the client's reader into a bounded memory stream (never blocking
the reader); the consumer side passes each through a :class:`~bus.codec.Guard` (subject,
payload, clock). Anything refused — bad subject, oversized, malformed, wrong version, a node
speaking for another node, a timestamp in the future, or a full buffer because the consumer is
too slow — is counted in ``BusMetrics.dropped`` and logged at most once a minute per sender, and
the subscription carries on. Nothing a sender puts on the wire can end a subscription.

Events come out in the order the server delivered them: that order, never an event's ``ts``,
is what "newer" means on the bus. With ``include_state=True`` the subscription also yields the
retained state of every matching node (the newest valid message per subject, see
:mod:`bus.state`), read again after every reconnect (the subscription may have missed events
meanwhile, or the server may have lost its store). The live subscription is opened *before*
the state is read, and a state read is yielded at its place in that order: after the live
messages received before the read completed (the server wrote their live copies to this
connection before it answered the read, so they are older or the same) and before those
received after. So retained state never rolls back a newer live event; an event may be seen
twice, which is harmless for last-value state.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from bus import events, state, subjects
from bus.codec import DropLog, Guard
from bus.connection import Connection
from bus.errors import InvalidSubject, NotConnected, StateUnavailable
from bus.jetstream import RawMessage
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from kit import backoff

__all__ = ["Subscription", "parse_filter", "subscribe"]

log = logging.getLogger(__name__)

_UNKNOWN: Final = "unknown"
_MAX_STATE_RETRY_S: Final = 5.0
Item = RawMessage | None
"""What the memory stream carries: a live message, or None, a wake-up for a state read."""


def parse_filter(subject: str) -> tuple[str | None, subjects.Kind | None]:
    """Split a subscription filter into ``(node, kind)``; ``None`` means any.

    Accepts ``gpustack.v1.node.<node|*>.<kind|*>`` and ``gpustack.v1.node.<node|*>.>``.

    :raises InvalidSubject: anything else (the bus publishes nothing outside that space).
    """
    if subject == subjects.ALL:
        return None, None
    head, _, last = subject.rpartition(".")
    prefix, _, token = head.rpartition(".")
    if prefix != subjects.PREFIX:
        raise InvalidSubject(f"not a bus filter: {subject!r}")
    kind = (
        None if last in ("*", ">") else subjects.parse(f"{head}.{last}".replace(token, "x", 1))[1]
    )
    node = None if token == "*" else subjects.decode_node(token)
    return node, kind


class _Counter:
    """Live messages put into the memory stream so far (the reader's side counts them), and
    taken out of it (the consumer's side)."""

    def __init__(self) -> None:
        self.count = 0
        self.taken = 0


class _StateSource:
    """How a subscription reads its retained state, and whether it must read it again."""

    def __init__(
        self, conn: Connection, settings: BusSettings, node: str | None, kind: subjects.Kind | None
    ) -> None:
        self.conn, self.settings, self.node, self.kind = conn, settings, node, kind
        self.stale = False
        self.failures = 0
        self.retry_at = -math.inf

    async def read(self, guard: Guard) -> list[state.Valid]:
        """:raises StateUnavailable: :raises NotConnected:"""
        conn, node, kind = self.conn, self.node, self.kind
        return await state.retained(conn, self.settings, node=node, kind=kind, guard=guard)

    def failed(self, e: Exception) -> None:
        """Retry later, with a capped backoff: after a store loss the streams come back only
        when some component re-creates them (agents and the worker do on reconnect)."""
        if not self.failures:
            log.info("retained state not readable after reconnecting, retrying: %s", e)
        self.failures += 1
        first, cap = self.settings.reconnect_wait_s, _MAX_STATE_RETRY_S
        self.retry_at = anyio.current_time() + backoff.delay(
            self.failures, first_s=first, max_s=cap
        )


class Subscription:
    """Decoded events from one subject filter; iterate it, or :meth:`serve` a handler."""

    def __init__(
        self,
        receive: MemoryObjectReceiveStream[Item],
        send: MemoryObjectSendStream[Item],
        *,
        guard: Guard,
        received: _Counter,
        source: _StateSource | None = None,
    ) -> None:
        self._receive = receive
        self._send = send
        self.guard = guard
        self._received = received
        self._source = source
        self._states: deque[tuple[int, deque[state.Valid]]] = deque()
        """State reads waiting for their place: (live messages received before it, events)."""

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> events.Event:
        """The next event. A live message already waiting costs no await (this runs for every
        message: thousands a second in the worker)."""
        while True:
            if self._source is not None and self._source.stale:
                await self._read_state_if_stale()
            if self._states:
                found = self._next_state()
                if found is not None:
                    return found[1]
            try:
                item = self._receive.receive_nowait()
            except anyio.WouldBlock:
                item = await self._receive_item()
            if item is None:
                continue  # woken: a state read is due, or its place may have come
            self._received.taken += 1
            event = self.guard.accept(*item)
            if event is not None:
                return event

    async def _receive_item(self) -> Item:
        """Wait for a live message, or until a state read is due (None)."""
        source = self._source
        wait = source.retry_at - anyio.current_time() if source and source.stale else math.inf
        with anyio.move_on_after(wait):
            try:
                return await self._receive.receive()
            except anyio.EndOfStream:
                raise StopAsyncIteration from None
        return None

    def _next_state(self) -> state.Valid | None:
        while self._states and self._states[0][0] <= self._received.taken:
            batch = self._states[0][1]
            if batch:
                return batch.popleft()
            self._states.popleft()
        return None

    async def _read_state_if_stale(self) -> None:
        source = self._source
        if source is None or not source.stale or anyio.current_time() < source.retry_at:
            return
        try:
            self.add_state(await source.read(self.guard))
        except NotConnected:
            source.stale = False  # disconnected again: the next reconnect marks it stale
        except StateUnavailable as e:
            source.failed(e)
        else:
            source.stale, source.failures = False, 0

    def add_state(self, retained: list[state.Valid]) -> None:
        """Queue a state read that just completed, at its place among the live messages."""
        self._states.append((self._received.count, deque(retained)))

    def reconnected(self) -> None:
        """The connection came back: read the state again (in the consumer, never here)."""
        if self._source is not None:
            self._source.stale, self._source.failures = True, 0
            self._source.retry_at = -math.inf
            try:
                self._send.send_nowait(None)  # wake a consumer waiting for live messages
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # full: it has messages to wake up for; closed: nobody waits

    def decode(self, subj: str, data: bytes) -> events.Event | None:
        """Decode one raw message, or count and drop it (returning None)."""
        return self.guard.accept(subj, data)

    async def serve(self, handler: Callable[[events.Event], Awaitable[None]]) -> None:
        """Await ``handler(event)`` for every event, in order, until the subscription ends."""
        async for event in self:
            await handler(event)


def _on_message(
    send: MemoryObjectSendStream[Item], drops: DropLog, received: _Counter, buffer: int = 4096
) -> Callable[[str, bytes], bool]:
    """The client-side callback; it asks the client to yield once the buffer is half full.

    The client's delivery task does not suspend while messages wait in its own queue, so
    without that yield a burst would fill the buffer and drop while the consumer never ran;
    with it, the client's (larger, bounded) queue holds the burst, as it does for any
    subscriber.
    """
    high = max(1, buffer // 2)

    def on_message(subj: str, data: bytes) -> bool:
        try:
            send.send_nowait((subj, data))
        except anyio.WouldBlock:
            # The consumer is behind: drop the newest rather than grow without bound.
            kind = subj.rpartition(".")[2]
            drops.record(
                kind=kind if kind in subjects.KINDS else _UNKNOWN,
                reason="overflow",
                sender=subj[:120],
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False  # closing: late messages are discarded
        else:
            received.count += 1
        return received.count - received.taken >= high

    return on_message


@asynccontextmanager
async def subscribe(  # noqa: PLR0913 - keyword-only, each optional
    conn: Connection,
    *,
    settings: BusSettings,
    metrics: BusMetrics,
    node: str | None = None,
    kind: subjects.Kind | None = None,
    subject: str | None = None,
    include_state: bool = False,
    buffer: int = 4096,
    memo_kinds: frozenset[subjects.Kind] = frozenset(),
) -> AsyncIterator[Subscription]:
    """Subscribe to the events of ``node`` (or all) and ``kind`` (or all), or to ``subject``.

    :param subject: a raw filter (see :func:`parse_filter`); overrides ``node`` and ``kind``.
    :param include_state: yield the retained state of matching nodes too (read again after
        every reconnect).
    :param buffer: messages held for a slow consumer before new ones are dropped (counted).
    :param memo_kinds: kinds whose unchanged restatements are recalled instead of decoded
        (:class:`~bus.codec.Guard`): for a consumer of every node's state at scale.
    :raises InvalidSubject: ``subject`` is outside the bus's subject space.
    :raises InvalidNodeName: ``node`` cannot be put in a subject.
    :raises StateUnavailable: ``include_state`` and the retention streams cannot be read.
    """
    if subject is not None:
        node, kind = parse_filter(subject)
    filt = subject or subjects.filter_for(node, kind)
    guard = state.guard_for(settings, metrics, memo_kinds=memo_kinds)
    received = _Counter()
    source = _StateSource(conn, settings, node, kind) if include_state else None
    send, receive = anyio.create_memory_object_stream[Item](buffer)
    with send, receive:
        async with conn.subscribe(filt, _on_message(send, guard.drops, received, buffer)):
            sub = Subscription(receive, send, guard=guard, received=received, source=source)
            if source is not None:
                sub.add_state(await source.read(guard))
            with conn.reconnect_callback(sub.reconnected):
                yield sub

"""NATS -> typed events: a subscription is an async iterator of :data:`bus.events.Event`.

Raw messages are handed from the client's reader into a bounded memory stream (never blocking
the reader); the consumer side parses the subject, decodes and validates the payload. Anything
refused — bad subject, oversized, malformed, wrong version, a node speaking for another node, or
a full buffer because the consumer is too slow — is counted in ``BusMetrics.dropped`` and logged
at most once a minute per sender, and the subscription carries on. Nothing a sender puts on the
wire can end a subscription.

With ``include_state=True`` the subscription first yields the retained state of every matching
node (see :mod:`bus.state`), then live events. The live subscription is opened *before* the
state is read, so nothing published in between is missed; an event may be seen twice, which is
harmless for last-value state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from bus import codec, events, state, subjects
from bus.codec import DropLog
from bus.connection import Connection, RawMessage
from bus.errors import DecodeFailed, InvalidSubject
from bus.metrics import BusMetrics
from bus.settings import BusSettings

__all__ = ["Subscription", "parse_filter", "subscribe"]

_UNKNOWN: Final = "unknown"


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


class Subscription:
    """Decoded events from one subject filter; iterate it, or :meth:`serve` a handler."""

    def __init__(
        self,
        receive: MemoryObjectReceiveStream[RawMessage],
        *,
        settings: BusSettings,
        drops: DropLog,
        retained: list[RawMessage],
    ) -> None:
        self._receive = receive
        self._max_bytes = settings.max_payload_bytes
        self._drops = drops
        self._retained = retained

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> events.Event:
        while True:
            if self._retained:
                subj, data = self._retained.pop(0)
            else:
                try:
                    subj, data = self._receive.receive_nowait()
                except anyio.WouldBlock:
                    try:
                        subj, data = await self._receive.receive()
                    except anyio.EndOfStream:
                        raise StopAsyncIteration from None
            event = self.decode(subj, data)
            if event is not None:
                return event

    def decode(self, subj: str, data: bytes) -> events.Event | None:
        """Decode one raw message, or count and drop it (returning None)."""
        try:
            node, kind = subjects.parse(subj)
        except InvalidSubject as e:
            self._drops.record(kind=_UNKNOWN, reason="subject", sender=subj[:120], detail=str(e))
            return None
        try:
            return codec.decode(data, kind=kind, node=node, max_bytes=self._max_bytes)
        except DecodeFailed as e:
            self._drops.record(kind=kind, reason=e.reason, sender=node, detail=e.detail)
            return None

    async def serve(self, handler: Callable[[events.Event], Awaitable[None]]) -> None:
        """Await ``handler(event)`` for every event, in order, until the subscription ends."""
        async for event in self:
            await handler(event)


def _on_message(
    send: MemoryObjectSendStream[RawMessage], drops: DropLog
) -> Callable[[str, bytes], None]:
    def on_message(subj: str, data: bytes) -> None:
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
            pass  # closing: late messages are discarded

    return on_message


@asynccontextmanager
async def subscribe(
    conn: Connection,
    *,
    settings: BusSettings,
    metrics: BusMetrics,
    node: str | None = None,
    kind: subjects.Kind | None = None,
    subject: str | None = None,
    include_state: bool = False,
    buffer: int = 4096,
) -> AsyncIterator[Subscription]:
    """Subscribe to the events of ``node`` (or all) and ``kind`` (or all), or to ``subject``.

    :param subject: a raw filter (see :func:`parse_filter`); overrides ``node`` and ``kind``.
    :param include_state: yield the retained state of matching nodes first.
    :param buffer: messages held for a slow consumer before new ones are dropped (counted).
    :raises InvalidSubject: ``subject`` is outside the bus's subject space.
    :raises InvalidNodeName: ``node`` cannot be put in a subject.
    :raises StateUnavailable: ``include_state`` and the retention streams cannot be read.
    """
    if subject is not None:
        node, kind = parse_filter(subject)
    filt = subject or subjects.filter_for(node, kind)
    drops = DropLog(metrics)
    send, receive = anyio.create_memory_object_stream[RawMessage](buffer)
    with send, receive:
        async with conn.subscribe(filt, _on_message(send, drops)):
            retained: list[RawMessage] = []
            if include_state:
                retained = await state.snapshot(conn, settings, node=node, kind=kind)
            yield Subscription(receive, settings=settings, drops=drops, retained=retained)

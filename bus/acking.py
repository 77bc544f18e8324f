"""Pipelined JetStream acknowledgements: send now, learn later whether the stream stored it.

Waiting for each acknowledgement before sending the next one caps a publisher at one round trip
per event. An :class:`AckWindow` instead sends each message with a reply subject of its own
(``<inbox>.<token>``) on one wildcard subscription and matches the stream's answer to the
flight by token, so many acknowledgements can be awaited at once. It only uses the public
:class:`~bus.connection.Connection` API (publish with a reply subject, subscribe).

Invariants:

- every flight ends exactly once: ``on_done(None)`` when stored, ``on_done(PublishFailed)``
  when refused (an error answer, or an empty answer: no stream takes the subject), when no
  answer came within ``timeout_s`` (:meth:`AckWindow.expire`), or when the window closes;
- ``on_done`` is never called from inside :meth:`AckWindow.send`, and never for a message that
  :meth:`~AckWindow.send` did not manage to hand to the client (it raised or was cancelled);
- a late answer for an ended flight is ignored.

The deadlines are checked by whoever waits (:meth:`next_deadline`, :meth:`expire`): no timer
tasks, nothing left running when the window closes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import msgspec

from bus.connection import Connection
from bus.errors import BusError, PublishFailed

__all__ = ["AckWindow", "OnDone", "ack_window"]

OnDone = Callable[[BusError | None], None]
"""Told the outcome of one flight: None (stored) or the failure."""


class _ApiError(msgspec.Struct):
    code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    error: _ApiError | None = None


_decode_ack = msgspec.json.Decoder(_PubAck).decode


def outcome(subject: str, answer: bytes) -> BusError | None:
    """The meaning of a stream's answer to a publish to ``subject`` (pure)."""
    if not answer:
        return PublishFailed(f"publish {subject}: no stream takes this subject")
    try:
        ack = _decode_ack(answer)
    except msgspec.DecodeError as e:
        return PublishFailed(f"publish {subject}: unreadable acknowledgement: {e}")
    if ack.error is not None:
        return PublishFailed(
            f"publish {subject}: refused ({ack.error.code}): {ack.error.description}"
        )
    if not ack.stream:
        return PublishFailed(f"publish {subject}: acknowledgement names no stream")
    return None


class _Flight(msgspec.Struct):
    subject: str
    deadline: float
    on_done: OnDone


class AckWindow:
    """Acknowledged publishes in flight on one connection; create with :func:`ack_window`."""

    def __init__(self, conn: Connection, inbox: str, *, timeout_s: float) -> None:
        self._conn = conn
        self._inbox = inbox
        self._timeout_s = timeout_s
        self._tokens = itertools.count()
        self._flights: dict[str, _Flight] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._flights)

    async def send(self, subject: str, payload: bytes, on_done: OnDone) -> None:
        """Hand the message to the client; ``on_done`` is called later with the outcome.

        :raises NotConnected: not sent (``on_done`` will not be called).
        :raises PublishFailed: not sent, or the window is closed (``on_done`` will not be called).
        """
        if self._closed:
            raise PublishFailed(f"publish {subject}: acknowledgement window closed")
        token = str(next(self._tokens))
        deadline = anyio.current_time() + self._timeout_s
        self._flights[token] = _Flight(subject, deadline, on_done)
        try:
            await self._conn.publish(subject, payload, reply=f"{self._inbox}.{token}")
        except BaseException:
            del self._flights[token]  # a late answer is ignored: the caller keeps the message
            raise

    def answered(self, reply_subject: str, answer: bytes) -> None:
        """The subscription callback: end the flight the answer belongs to (never raises)."""
        flight = self._flights.pop(reply_subject.rpartition(".")[2], None)
        if flight is not None:
            flight.on_done(outcome(flight.subject, answer))

    def next_deadline(self) -> float:
        """When the oldest flight expires (``inf`` with none in flight)."""
        return min((f.deadline for f in self._flights.values()), default=math.inf)

    def expire(self, now: float) -> int:
        """Fail every flight whose deadline passed; returns how many."""
        late = [t for t, f in self._flights.items() if f.deadline <= now]
        for token in late:
            flight = self._flights.pop(token)
            flight.on_done(
                PublishFailed(f"publish {flight.subject}: no acknowledgement in {self._timeout_s}s")
            )
        return len(late)

    def close(self) -> None:
        """Fail every flight still open and refuse new ones."""
        self._closed = True
        flights, self._flights = self._flights, {}
        for flight in flights.values():
            flight.on_done(PublishFailed(f"publish {flight.subject}: window closed"))


@asynccontextmanager
async def ack_window(conn: Connection, *, timeout_s: float) -> AsyncIterator[AckWindow]:
    """An :class:`AckWindow` with its reply subscription; closed (flights failed) on exit."""
    inbox = conn.new_inbox()
    window = AckWindow(conn, inbox, timeout_s=timeout_s)
    try:
        async with conn.subscribe(f"{inbox}.*", window.answered):
            yield window
    finally:
        window.close()

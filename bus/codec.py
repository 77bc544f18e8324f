"""Bytes <-> events: the module-level encoder, the strict decoder and the drop log.

Decoding is strict about what matters and lenient about what does not:

- refused and counted: oversized payloads, invalid JSON or shapes, values outside the
  semantic bounds the types carry (:mod:`bus.bounds`: checked by the same decode, counted as
  ``malformed``), a ``v`` other than
  :data:`bus.events.VERSION`, a ``kind`` that differs from the subject's, a ``node`` that differs
  from the subject's (a node may only speak for itself), and (:class:`Guard`) a subject outside
  the grammar or a ``ts`` further than ``max_skew_s`` in the receiver's future;
- accepted: unknown fields, so a newer publisher adding optional fields does not break older
  subscribers; old timestamps (an outbox holds events across a long disconnect, retained state
  is as old as its last change, and no receiver orders by ``ts``).

The happy path is one ``msgspec`` decode; the envelope is only decoded again to label a failure.
A :class:`Guard` may also *recall* a state event that repeats the last one accepted on its
subject with only a new stamp (see :class:`Guard`), which skips that decode.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from bus import events, records, subjects
from bus.errors import DecodeFailed, InvalidSubject
from bus.metrics import BusMetrics
from bus.subjects import KINDS, Kind

__all__ = ["REPEATED_KINDS", "DropLog", "Guard", "decode", "encode", "json_schema"]

log = logging.getLogger(__name__)


class _Envelope(msgspec.Struct):
    """Just enough of any message to tell "newer version" from "garbage"."""

    v: int | None = None


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(events.Event)
_ENVELOPE: Final = msgspec.json.Decoder(_Envelope)
_STAMP: Final = msgspec.json.Decoder(datetime)
_TS_KEY: Final = b'"ts":"'

REPEATED_KINDS: Final = frozenset(KINDS) - {"samples"}
"""The kinds an agent re-sends unchanged (state restated on a period or a reconnect): worth a
:class:`Guard`'s memory. A sample differs every time."""


def encode(event: events.Event) -> bytes:
    """The JSON wire form of ``event``."""
    return _ENCODER.encode(event)


def decode(data: bytes, *, kind: Kind, node: str, max_bytes: int) -> events.Event:
    """Decode a payload received on the subject of ``node`` and ``kind``.

    :raises DecodeFailed: with ``reason`` one of ``oversized``, ``malformed``, ``version``,
        ``kind``, ``node``.
    """
    if len(data) > max_bytes:
        raise DecodeFailed("oversized", f"{len(data)} > {max_bytes} bytes")
    try:
        event = _DECODER.decode(data)
    except msgspec.DecodeError as e:
        raise DecodeFailed(_failure_reason(data), str(e)) from e
    if event.v != events.VERSION:
        raise DecodeFailed("version", f"v={event.v}")
    if events.kind_of(event) != kind:
        raise DecodeFailed("kind", f"{events.kind_of(event)} on a {kind} subject")
    if event.node != node:
        raise DecodeFailed("node", f"{event.node!r} on the subject of {node!r}")
    return event


def check_skew(event: events.Event, *, now: float, max_skew_s: float) -> None:
    """Refuse an event stamped more than ``max_skew_s`` after ``now`` (POSIX seconds; pure).

    A stamp without a zone is read as UTC, as every publisher of ours writes it.

    :raises DecodeFailed: ``reason="future"``.
    """
    ts = event.ts if event.ts.tzinfo is not None else event.ts.replace(tzinfo=UTC)
    if ts.timestamp() - now > max_skew_s:
        raise DecodeFailed("future", f"ts {ts.isoformat()} is {ts.timestamp() - now:.0f}s ahead")


def _failure_reason(data: bytes) -> str:
    # A v2 publisher may change shapes; label that "version", not "malformed", so the metric says
    # "upgrade the subscriber" instead of "someone sends garbage".
    try:
        v = _ENVELOPE.decode(data).v
    except msgspec.DecodeError:
        return "malformed"
    return "version" if v is not None and v != events.VERSION else "malformed"


AGENT_RECORDS: Final = (
    records.ArtifactRecord,
    records.StoreSpecRecord,
    records.StoreSpec,
    records.PendingContainers,
)
"""What the control plane writes into ``GPUSTACK_V1_AGENTS`` (also described in the schema)."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of :data:`bus.events.Event`, for ``gpustack-operator bus schema``.

    Its ``$defs`` also describe the records the control plane pushes to the agents
    (:data:`AGENT_RECORDS`: ``ArtifactRecord`` with its ``BindingQuota``s, ``StoreSpecRecord``
    and the ``StoreSpec`` its ``spec`` is read as, ``PendingContainers``), though the document
    itself validates an event only.
    """
    (schema, *_), components = msgspec.json.schema_components(
        (events.Event, *AGENT_RECORDS), ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gpustack-operator bus event, v1",
        **schema,
        "$defs": components,
    }


class DropLog:
    """Counts refused messages and logs them at most once per ``interval_s`` per sender.

    A misbehaving sender can publish thousands of bad messages a second; the counter sees every
    one, the log sees one line a minute. The per-sender memory is bounded by ``max_senders``.
    """

    def __init__(
        self,
        metrics: BusMetrics,
        *,
        interval_s: float = 60.0,
        max_senders: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._interval_s = interval_s
        self._max_senders = max_senders
        self._clock = clock
        self._last_logged: dict[str, float] = {}

    def record(self, *, kind: str, reason: str, sender: str, detail: str = "") -> bool:
        """Count one refused message; return whether it was logged."""
        self._metrics.dropped.labels(kind=kind, reason=reason).inc()
        t = self._clock()
        last = self._last_logged.get(sender)
        if last is not None and t - last < self._interval_s:
            return False
        if last is None and len(self._last_logged) >= self._max_senders:
            self._prune(t)
        self._last_logged[sender] = t
        log.warning(
            "dropped a %s message from %s: %s %s (logged once a minute per sender)",
            kind,
            sender,
            reason,
            detail[:200],
        )
        return True

    def _prune(self, t: float) -> None:
        self._last_logged = {s: v for s, v in self._last_logged.items() if t - v < self._interval_s}
        if len(self._last_logged) >= self._max_senders:
            self._last_logged.clear()


_UNKNOWN: Final = "unknown"


class _Memo(msgspec.Struct, frozen=True):
    """The last payload accepted on one subject, cut around its stamp, and its event."""

    prefix: bytes
    """Everything up to and including the opening quote of ``ts``."""
    suffix: bytes
    """Everything from the closing quote of ``ts``."""
    event: events.Event


class Guard:
    """The one gate every received message passes, live or retained: subject, payload, clock.

    :meth:`accept` returns the event or, for anything refused, counts and logs it in ``drops``
    and returns None, so a reader of retained state and a live subscriber refuse the same things
    for the same reasons.

    With ``memo_kinds``, the guard remembers per subject the last accepted payload of those kinds
    when it is *canonical* (exactly what :func:`encode` makes of the event it decoded to: no
    unknown or duplicate field, no escape, so its ``ts`` is the first ``"ts":"`` and the only
    one). A later payload that differs from it only inside the stamp's quotes, and whose stamp
    msgspec parses as a datetime, is then the same event with that stamp, so it is recalled
    (the remembered event with the new ``ts``) instead of decoded. Invariant: a recalled event
    equals what a full decode of the payload would return, and whatever a full decode would
    refuse (size, stamp, clock) takes the full path and is refused and counted there. Memory:
    at most ``memo_entries`` subjects, payloads of at most ``memo_bytes``.
    """

    def __init__(
        self,
        drops: DropLog,
        *,
        max_bytes: int,
        max_skew_s: float,
        clock: Callable[[], float] = time.time,
        memo_kinds: frozenset[Kind] = frozenset(),
        memo_entries: int = 65536,
        memo_bytes: int = 65536,
    ) -> None:
        self.drops = drops
        self._max_bytes = max_bytes
        self._max_skew_s = max_skew_s
        self._clock = clock
        self._limit_at = math.inf
        self._limit = datetime.min.replace(tzinfo=UTC)
        self._memo_kinds = memo_kinds
        self._memo: dict[str, _Memo] = {}
        self._memo_entries = memo_entries
        self._memo_bytes = min(memo_bytes, max_bytes)

    def accept(self, subject: str, data: bytes) -> events.Event | None:
        """The decoded event on ``subject``, or None (counted and logged) when refused."""
        memo = self._memo.get(subject) if self._memo_kinds else None
        if memo is not None:
            recalled = self._recall(memo, data)
            if recalled is not None:
                return recalled
        try:
            node, kind = subjects.parse(subject)
        except InvalidSubject as e:
            self.drops.record(kind=_UNKNOWN, reason="subject", sender=subject[:120], detail=str(e))
            return None
        try:
            event = decode(data, kind=kind, node=node, max_bytes=self._max_bytes)
            if event.ts.tzinfo is None or event.ts > self._skew_limit():
                check_skew(event, now=self._clock(), max_skew_s=self._max_skew_s)
        except DecodeFailed as e:
            self.drops.record(kind=kind, reason=e.reason, sender=node, detail=e.detail)
            return None
        if kind in self._memo_kinds:
            self._remember(subject, data, event)
        return event

    def _recall(self, memo: _Memo, data: bytes) -> events.Event | None:
        """The remembered event with ``data``'s stamp, or None: take the full path."""
        start, end = len(memo.prefix), len(data) - len(memo.suffix)
        if end < start or len(data) > self._memo_bytes:
            return None
        if not data.startswith(memo.prefix) or not data.endswith(memo.suffix):
            return None
        stamp = data[start - 1 : end + 1]  # with its quotes
        if b'"' in stamp[1:-1] or b"\\" in stamp:
            return None
        try:
            ts = _STAMP.decode(stamp)
        except msgspec.DecodeError:
            return None
        if ts.tzinfo is None or ts > self._skew_limit():
            return None  # the full path checks the clock (and counts a refusal)
        return msgspec.structs.replace(memo.event, ts=ts)

    def _remember(self, subject: str, data: bytes, event: events.Event) -> None:
        """Remember ``data`` for :meth:`_recall` when it is canonical (else forget the subject)."""
        memo = self._memo.pop(subject, None)
        if len(data) > self._memo_bytes or encode(event) != data:
            return
        start = data.find(_TS_KEY) + len(_TS_KEY)
        end = data.find(b'"', start)
        if start < len(_TS_KEY) or end < 0 or _STAMP.decode(data[start - 1 : end + 1]) != event.ts:
            return  # not where encode puts it: never recall (defensive, encode always does)
        if memo is None and len(self._memo) >= self._memo_entries:
            del self._memo[next(iter(self._memo))]  # the longest-remembered subject
        self._memo[subject] = _Memo(prefix=data[:start], suffix=data[end:], event=event)

    def _skew_limit(self) -> datetime:
        """The latest stamp let through without a closer look: ``max_skew_s`` past the clock
        as it was up to a second ago (so it errs early, and :func:`check_skew` decides). The hot
        path pays one comparison of two datetimes; the clock's reading is converted once a
        second, or again whenever it went back."""
        now = self._clock()
        if not 0.0 <= now - self._limit_at < 1.0:
            self._limit_at = now
            self._limit = datetime.fromtimestamp(now + self._max_skew_s, UTC)
        return self._limit

"""Retained state in JetStream: what a late subscriber or a restarted worker sees first.

Three streams capture the node subjects (publishers need not know about them; the server stores
whatever is published on a captured subject):

=====================  ================================  ======================  =================
stream                 subjects                          kept per subject        expires
=====================  ================================  ======================  =================
``GPUSTACK_V1_STATE``  ``gpustack.v1.node.*.devices``,   ``state_per_subject``   ``state_max_age_s``
                       ``….models``, ``….agent``         (8)                     (1 h)
``GPUSTACK_V1_SAMPLES`` ``gpustack.v1.node.*.samples``   2                       ``samples_max_age_s``
``GPUSTACK_V1_HISTORY`` ``….health``, ``….allocations``  ``history_per_node``    ``history_max_age_s``
=====================  ================================  ======================  =================

The server cannot validate a payload (no schema on a stream), so a stream stores whatever a
sender with publish rights puts on a captured subject. Two things keep that from mattering:

- **readers take the newest valid message**, not the last one: every subject keeps a short
  history, and :func:`retained` walks back from the last message to the newest one the
  :class:`~bus.codec.Guard` accepts (grammar, size, schema, version, node, clock), counting what
  it skipped. One garbage publish no longer hides a node's state; hiding it takes
  ``state_per_subject`` bad messages in a row, and lasts until the agent's next republish;
- **server-side limits** bound what garbage can cost: only the six kinds are captured (a junk
  kind is stored nowhere), one message is at most ``max_payload_bytes``, each stream has a byte
  cap (``discard: old``), and state not republished for ``state_max_age_s`` expires, so a
  node that is gone (or a junk node token) leaves nothing behind. Agents republish well within
  that age (:func:`bus.settings.check_republish`).

Creating the streams is idempotent: create, or update an existing stream (e.g. one made with an
older configuration) to this one. Nothing here ever purges or deletes; streams deny deletion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from bus import events, subjects
from bus.codec import DropLog, Guard
from bus.connection import Connection
from bus.errors import InvalidSubject
from bus.jetstream import RawMessage
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from bus.subjects import Kind

__all__ = [
    "StreamSpec",
    "ensure_streams",
    "history",
    "newest_valid",
    "retained",
    "snapshot",
    "stream_specs",
]

STATE_STREAM: Final = "GPUSTACK_V1_STATE"
SAMPLES_STREAM: Final = "GPUSTACK_V1_SAMPLES"
HISTORY_STREAM: Final = "GPUSTACK_V1_HISTORY"
SAMPLES_PER_SUBJECT: Final = 2
"""A garbage sample hides the last real one only until the next sampling period."""

Valid = tuple[RawMessage, events.Event]
"""A retained message and the event it decodes to."""


class StreamSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one retention stream holds, for how long, and how much of it."""

    name: str
    kinds: tuple[Kind, ...]
    max_msgs_per_subject: int
    max_age_s: float
    max_bytes: int
    max_msg_size: int

    @property
    def subjects(self) -> list[str]:
        """One filter per known kind, never a wildcard kind: junk kinds are not retained."""
        return [subjects.filter_for(None, k) for k in self.kinds]


def stream_specs(settings: BusSettings) -> list[StreamSpec]:
    """The streams the bus needs, from the retention settings (pure)."""
    size = settings.max_payload_bytes
    return [
        StreamSpec(
            name=STATE_STREAM,
            kinds=("devices", "models", "agent"),
            max_msgs_per_subject=settings.state_per_subject,
            max_age_s=settings.state_max_age_s,
            max_bytes=settings.state_max_bytes,
            max_msg_size=size,
        ),
        StreamSpec(
            name=SAMPLES_STREAM,
            kinds=("samples",),
            max_msgs_per_subject=SAMPLES_PER_SUBJECT,
            max_age_s=settings.samples_max_age_s,
            max_bytes=settings.samples_max_bytes,
            max_msg_size=size,
        ),
        StreamSpec(
            name=HISTORY_STREAM,
            kinds=("health", "allocations"),
            max_msgs_per_subject=settings.history_per_node,
            max_age_s=settings.history_max_age_s,
            max_bytes=settings.history_max_bytes,
            max_msg_size=size,
        ),
    ]


async def ensure_streams(conn: Connection, settings: BusSettings) -> None:
    """Create every retention stream, or update it to this configuration.

    :raises StateUnavailable: JetStream is off or not answering.
    :raises NotConnected: the connection is down.
    """
    for spec in stream_specs(settings):
        await conn.streams.ensure(
            spec.name,
            spec.subjects,
            max_msgs_per_subject=spec.max_msgs_per_subject,
            max_age_s=spec.max_age_s,
            max_bytes=spec.max_bytes,
            max_msg_size=spec.max_msg_size,
            replicas=settings.state_replicas,
        )


def streams_for(kinds: frozenset[Kind], settings: BusSettings) -> list[StreamSpec]:
    """The streams holding any of ``kinds`` (pure)."""
    return [s for s in stream_specs(settings) if kinds.intersection(s.kinds)]


def newest_valid(
    messages: Sequence[RawMessage], accept: Callable[[str, bytes], events.Event | None]
) -> Valid | None:
    """The newest of ``messages`` (stored order, oldest first) that ``accept`` takes, or None.

    Every message tried and refused on the way is ``accept``'s to count (a :class:`Guard`
    counts and logs it).
    """
    for subject, data in reversed(messages):
        event = accept(subject, data)
        if event is not None:
            return (subject, data), event
    return None


def guard_for(
    settings: BusSettings,
    metrics: BusMetrics | None = None,
    *,
    memo_kinds: frozenset[Kind] = frozenset(),
) -> Guard:
    """The :class:`Guard` of these settings, counting into ``metrics`` (a private set if None);
    ``memo_kinds``: see :class:`Guard`."""
    return Guard(
        DropLog(metrics or BusMetrics()),
        max_bytes=settings.max_payload_bytes,
        max_skew_s=settings.max_clock_skew_s,
        memo_kinds=memo_kinds,
    )


async def retained(
    conn: Connection,
    settings: BusSettings,
    *,
    node: str | None = None,
    kind: Kind | None = None,
    guard: Guard | None = None,
) -> list[Valid]:
    """The newest *valid* retained message of every subject matching ``node`` and ``kind``.

    One request per stream and kind reads the last message of every subject; only a subject
    whose last message ``guard`` refuses costs one more request, for its short history. A
    subject with no valid message left is missing from the result (and its refusals counted).
    Ordered by stream (devices/models/agent, samples, health/allocations), then by arrival.

    :raises StateUnavailable: a stream is missing or not answering.
    """
    guard = guard or guard_for(settings)
    kinds = frozenset(subjects.KINDS if kind is None else (kind,))
    out: list[Valid] = []
    for spec in streams_for(kinds, settings):
        for k in (k for k in spec.kinds if k in kinds):
            lasts = await conn.streams.last_per_subject(spec.name, subjects.filter_for(node, k))
            for raw in lasts:
                found = await _newest(conn, spec.name, raw, guard)
                out.extend([found] if found is not None else [])
    return out


async def _newest(conn: Connection, stream: str, last: RawMessage, guard: Guard) -> Valid | None:
    """``last`` when valid; else the newest valid message of its subject (one more read)."""
    event = guard.accept(*last)
    if event is not None:
        return last, event
    if not _walkable(last[0]):
        return None
    older = await conn.streams.all_retained(stream, last[0])
    return newest_valid(_before(older, last), guard.accept)


async def snapshot(
    conn: Connection,
    settings: BusSettings,
    *,
    node: str | None = None,
    kind: Kind | None = None,
    guard: Guard | None = None,
) -> list[RawMessage]:
    """:func:`retained`, as the raw ``(subject, payload)`` of each newest valid message.

    :raises StateUnavailable: a stream is missing or not answering.
    """
    return [raw for raw, _ in await retained(conn, settings, node=node, kind=kind, guard=guard)]


def _walkable(subject: str) -> bool:
    """A subject in the grammar: older messages on it may be valid (on a junk one, none is)."""
    try:
        subjects.parse(subject)
    except InvalidSubject:
        return False
    return True


def _before(messages: list[RawMessage], refused: RawMessage) -> list[RawMessage]:
    """``messages`` without the refused last one, so it is not tried (and counted) twice."""
    return messages[:-1] if messages and messages[-1] == refused else messages


async def history(
    conn: Connection, settings: BusSettings, *, node: str, kind: Kind
) -> list[RawMessage]:
    """Every retained message of one node's ``kind``, oldest first, unchecked.

    For the transition kinds (health, allocations) this is the bounded history
    (``history_per_node`` messages, ``history_max_age_s``); for the others, the last
    ``state_per_subject``. Callers decode each message through a :class:`Guard`.

    :raises StateUnavailable: the stream is missing or not answering.
    """
    (spec,) = streams_for(frozenset((kind,)), settings)
    return await conn.streams.all_retained(spec.name, subjects.filter_for(node, kind))

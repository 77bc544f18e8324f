"""Retained last-value state in JetStream: what a late subscriber sees first.

Three streams capture the node subjects (publishers need not know about them; the server stores
whatever is published on a captured subject):

=====================  ================================  ====================  ===============
stream                 subjects                          kept per subject      expires
=====================  ================================  ====================  ===============
``GPUSTACK_V1_STATE``  ``gpustack.v1.node.*.devices``,   1 (the latest)        never
                       ``….models``, ``….agent``
``GPUSTACK_V1_SAMPLES`` ``gpustack.v1.node.*.samples``   1                     ``samples_max_age_s``
``GPUSTACK_V1_HISTORY`` ``….health``, ``….allocations``  ``history_per_node``  ``history_max_age_s``
=====================  ================================  ====================  ===============

Health and allocation events are transitions, not whole states, so they keep a bounded history;
the snapshot below still returns only the latest of each per node.

Creating the streams is idempotent (create, or update to this configuration). Nothing here ever
purges or deletes; streams deny message deletion.
"""

from __future__ import annotations

from typing import Final

import msgspec

from bus import subjects
from bus.connection import Connection, RawMessage
from bus.settings import BusSettings
from bus.subjects import Kind

__all__ = ["StreamSpec", "ensure_streams", "history", "snapshot", "stream_specs"]

STATE_STREAM: Final = "GPUSTACK_V1_STATE"
SAMPLES_STREAM: Final = "GPUSTACK_V1_SAMPLES"
HISTORY_STREAM: Final = "GPUSTACK_V1_HISTORY"


class StreamSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one retention stream holds and for how long."""

    name: str
    kinds: tuple[Kind, ...]
    max_msgs_per_subject: int
    max_age_s: float | None
    """``None``: kept until replaced."""

    @property
    def subjects(self) -> list[str]:
        return [subjects.filter_for(None, k) for k in self.kinds]


def stream_specs(settings: BusSettings) -> list[StreamSpec]:
    """The streams the bus needs, from the retention settings (pure)."""
    return [
        StreamSpec(
            name=STATE_STREAM,
            kinds=("devices", "models", "agent"),
            max_msgs_per_subject=1,
            max_age_s=None,
        ),
        StreamSpec(
            name=SAMPLES_STREAM,
            kinds=("samples",),
            max_msgs_per_subject=1,
            max_age_s=settings.samples_max_age_s,
        ),
        StreamSpec(
            name=HISTORY_STREAM,
            kinds=("health", "allocations"),
            max_msgs_per_subject=settings.history_per_node,
            max_age_s=settings.history_max_age_s,
        ),
    ]


async def ensure_streams(conn: Connection, settings: BusSettings) -> None:
    """Create or update every retention stream.

    :raises StateUnavailable: JetStream is off or not answering.
    :raises NotConnected: the connection is down.
    """
    for spec in stream_specs(settings):
        await conn.ensure_stream(
            spec.name,
            spec.subjects,
            max_msgs_per_subject=spec.max_msgs_per_subject,
            max_age_s=spec.max_age_s,
            replicas=settings.state_replicas,
        )


def streams_for(kinds: frozenset[Kind], settings: BusSettings) -> list[StreamSpec]:
    """The streams holding any of ``kinds`` (pure)."""
    return [s for s in stream_specs(settings) if kinds.intersection(s.kinds)]


async def snapshot(
    conn: Connection, settings: BusSettings, *, node: str | None = None, kind: Kind | None = None
) -> list[RawMessage]:
    """The latest retained message of every subject matching ``node`` and ``kind``.

    Ordered by stream (devices/models/agent, then samples, then health/allocations) and, within
    a stream, by arrival.

    :raises StateUnavailable: a stream is missing or not answering.
    """
    kinds = frozenset(subjects.KINDS if kind is None else (kind,))
    out: list[RawMessage] = []
    for spec in streams_for(kinds, settings):
        for k in spec.kinds:
            if k in kinds:
                out.extend(await conn.last_per_subject(spec.name, subjects.filter_for(node, k)))
    return out


async def history(
    conn: Connection, settings: BusSettings, *, node: str, kind: Kind
) -> list[RawMessage]:
    """Every retained message of one node's ``kind``, oldest first.

    For the transition kinds (health, allocations) this is the bounded history
    (``history_per_node`` messages, ``history_max_age_s``); for the others, the latest message.

    :raises StateUnavailable: the stream is missing or not answering.
    """
    (spec,) = streams_for(frozenset((kind,)), settings)
    return await conn.all_retained(spec.name, subjects.filter_for(node, kind))

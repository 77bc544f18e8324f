"""Retained state holds only valid events: against a real nats-server, garbage, forged stamps
and junk subjects cannot replace a node's state; the streams are capped and expire gone nodes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import anyio
import msgspec
import pytest

from bus import codec, connection, events, publishing, state, subjects, subscribing, testing
from bus.errors import PublishFailed, StateUnavailable
from bus.metrics import BusMetrics
from bus.settings import BusSettings

pytestmark = pytest.mark.anyio

NODE = "n1"
DEVICES = subjects.subject(NODE, "devices")
REAL = testing.example_events(NODE)[0]
FORGED = msgspec.structs.replace(REAL, ts=datetime(2099, 1, 1, tzinfo=UTC), groups=())


async def _store(conn: connection.Connection, settings: BusSettings, *evs: events.Event) -> None:
    async with publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub:
        for e in evs:
            pub.publish(e)
        await pub.wait_sent()


async def test_a_garbage_publish_does_not_replace_a_nodes_retained_devices(
    conn: connection.Connection, settings: BusSettings, metrics: BusMetrics
) -> None:
    await _store(conn, settings, REAL)
    # The server cannot validate a payload: 400 KB of "[[[[" is stored on the devices subject.
    await conn.publish_acked(DEVICES, b"[" * 400_000)
    async with subscribing.subscribe(
        conn, settings=settings, metrics=metrics, include_state=True
    ) as sub:
        (first,) = await testing.collect(sub, 1, timeout_s=3)
    assert first == REAL  # a late subscriber still sees the node's GPUs
    assert metrics.dropped_count("devices", "malformed") == 1
    assert await state.snapshot(conn, settings, node=NODE) == [(DEVICES, codec.encode(REAL))]


async def test_readers_skip_forged_stamps_and_foreign_nodes_and_count_them(
    conn: connection.Connection, settings: BusSettings
) -> None:
    await _store(conn, settings, REAL)
    foreign = msgspec.structs.replace(REAL, node="n2", groups=())
    for forged in (FORGED, foreign):
        await conn.publish_acked(DEVICES, codec.encode(forged))
    metrics = BusMetrics()
    guard = state.guard_for(settings, metrics)
    assert await state.snapshot(conn, settings, guard=guard) == [(DEVICES, codec.encode(REAL))]
    assert metrics.dropped_count("devices", "node") == 1
    assert metrics.dropped_count("devices", "future") == 1


async def test_hiding_a_node_takes_a_whole_history_of_garbage(
    conn: connection.Connection, settings: BusSettings
) -> None:
    shallow = msgspec.structs.replace(settings, state_per_subject=3)
    await state.ensure_streams(conn, shallow)
    await _store(conn, shallow, REAL)
    for _ in range(2):
        await conn.publish_acked(DEVICES, b"{}")
    assert await state.snapshot(conn, shallow, node=NODE) == [(DEVICES, codec.encode(REAL))]
    await conn.publish_acked(DEVICES, b"{}")  # the third pushes the last valid one out
    metrics = BusMetrics()
    assert await state.snapshot(conn, shallow, guard=state.guard_for(shallow, metrics)) == []
    assert metrics.dropped_count("devices", "malformed") == 3


async def test_junk_kinds_are_not_retained_and_state_of_gone_nodes_expires(
    conn: connection.Connection, settings: BusSettings
) -> None:
    short = msgspec.structs.replace(settings, state_max_age_s=1.0)
    await state.ensure_streams(conn, short)
    with pytest.raises(PublishFailed):  # no stream captures a kind outside the six
        await conn.publish_acked(f"{subjects.PREFIX}.{NODE}.junk", b"{}")
    await conn.publish_acked(f"{subjects.PREFIX}.%zz.devices", b"{}")  # a junk node token
    await _store(conn, short, REAL)
    metrics = BusMetrics()
    found = await state.snapshot(conn, short, guard=state.guard_for(short, metrics))
    assert found == [(DEVICES, codec.encode(REAL))]
    assert metrics.dropped_count("unknown", "subject") == 1

    async def expired() -> bool:
        try:
            return not await conn.streams.last_per_subject(
                state.STATE_STREAM, subjects.filter_for()
            )
        except StateUnavailable:  # a read racing the expiry on a loaded machine timed out
            return False  # (the retryable answer): read again

    await testing.eventually(expired, timeout_s=5)  # the junk and the real node alike


async def test_an_old_stream_is_brought_to_the_caps_and_keeps_its_messages(
    conn: connection.Connection, settings: BusSettings
) -> None:
    kinds = ("devices", "models", "agent")
    old = [subjects.filter_for(None, k) for k in kinds]  # type: ignore[arg-type]
    # As an earlier release created it: the last message only, no age, no byte caps.
    await conn.streams.ensure(
        state.STATE_STREAM, old, max_msgs_per_subject=1, max_age_s=None, replicas=1
    )
    await conn.publish_acked(DEVICES, codec.encode(REAL))
    await state.ensure_streams(conn, settings)
    config = await conn.streams.config(state.STATE_STREAM)
    limits = ("max_msgs_per_subject", "max_age", "max_bytes", "max_msg_size", "discard")
    assert [config[k] for k in limits] == [
        settings.state_per_subject,
        settings.state_max_age_s,
        settings.state_max_bytes,
        settings.max_payload_bytes,
        "old",
    ]
    assert config["subjects"] == old
    assert await state.snapshot(conn, settings) == [(DEVICES, codec.encode(REAL))]
    with pytest.raises(PublishFailed):  # larger than one message may be
        await conn.publish_acked(DEVICES, b" " * (settings.max_payload_bytes + 1))


def test_newest_valid_walks_back_and_counts_what_it_skipped() -> None:
    metrics = BusMetrics()
    guard = codec.Guard(codec.DropLog(metrics), max_bytes=1 << 20, max_skew_s=300.0)
    older = msgspec.structs.replace(REAL, groups=())
    stored = [
        (DEVICES, codec.encode(older)),
        (DEVICES, codec.encode(REAL)),
        (DEVICES, codec.encode(FORGED)),
        (DEVICES, b"[[[["),
    ]
    assert state.newest_valid(stored, guard.accept) == (stored[1], REAL)
    assert metrics.total_dropped() == 2
    assert state.newest_valid(stored[2:], guard.accept) is None
    assert state.newest_valid([], guard.accept) is None


def test_a_stamp_within_the_skew_is_accepted_and_one_beyond_it_refused() -> None:
    now = datetime(2026, 6, 1, tzinfo=UTC)
    metrics = BusMetrics()
    guard = codec.Guard(
        codec.DropLog(metrics), max_bytes=1 << 20, max_skew_s=300.0, clock=now.timestamp
    )
    soon = msgspec.structs.replace(REAL, ts=now.replace(minute=4))
    late = msgspec.structs.replace(REAL, ts=now.replace(minute=6))
    naive = msgspec.structs.replace(REAL, ts=datetime(2099, 1, 1))  # no zone: read as UTC
    assert guard.accept(DEVICES, codec.encode(soon)) == soon
    assert guard.accept(DEVICES, codec.encode(REAL)) == REAL  # old stamps order nothing
    assert guard.accept(DEVICES, codec.encode(late)) is None
    assert guard.accept(DEVICES, codec.encode(naive)) is None
    assert metrics.dropped_count("devices", "future") == 2


async def test_a_state_read_is_yielded_at_its_place_among_live_messages() -> None:
    """Live messages received before a state read completed are older than what it holds, and
    those received after are newer: the read goes between them, so it never rolls one back."""
    old, new, newer = (msgspec.structs.replace(REAL, ts=REAL.ts.replace(day=d)) for d in (2, 3, 4))
    send, receive = anyio.create_memory_object_stream[subscribing.Item](16)
    received = subscribing._Counter()
    guard = state.guard_for(BusSettings())
    on_message = subscribing._on_message(send, guard.drops, received)
    with send, receive:
        sub = subscribing.Subscription(receive, send, guard=guard, received=received)
        on_message(DEVICES, codec.encode(old))
        sub.add_state([((DEVICES, codec.encode(new)), new)])
        on_message(DEVICES, codec.encode(newer))
        assert await testing.collect(sub, 3, timeout_s=1) == [old, new, newer]


async def test_the_state_is_read_again_after_a_reconnect(tmp_path: Path) -> None:
    """What was published while a subscriber was away arrives after its reconnect, from the
    retained state, not only at the sender's next publish."""
    async with testing.nats_server(tmp_path) as server:
        slow = testing.settings_for(server, reconnect_wait_s=1.5)  # back after the publisher
        settings = testing.settings_for(server)
        async with connection.connect(slow) as conn:
            await state.ensure_streams(conn, slow)
            async with subscribing.subscribe(
                conn, settings=slow, metrics=BusMetrics(), node=NODE, include_state=True
            ) as sub:
                await server.restart()  # the store is kept
                async with connection.connect(settings) as other:
                    await _store(other, settings, REAL)  # while the subscriber is away
                assert await testing.collect(sub, 1, timeout_s=8) == [REAL]

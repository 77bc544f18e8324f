"""Against a real nats-server: every event type end to end, retained state, garbage resistance."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from bus import connection, events, publishing, state, subjects, subscribing, testing
from bus.metrics import BusMetrics
from bus.settings import BusSettings

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


async def test_every_event_type_round_trips(
    conn: connection.Connection, settings: BusSettings, metrics: BusMetrics
) -> None:
    sent = testing.example_events("ip-10-0-0-1.ec2.internal") + testing.example_events("nœud-2")
    async with (
        subscribing.subscribe(conn, settings=settings, metrics=metrics) as sub,
        publishing.publisher(conn, settings=settings, metrics=metrics) as pub,
    ):
        for ev in sent:
            pub.publish(ev)
        got = await testing.collect(sub, len(sent))
    key = lambda e: (e.node, events.kind_of(e))
    assert sorted(got, key=key) == sorted(sent, key=key)
    assert metrics.total_dropped() == 0


async def test_filters_by_node_and_kind(
    conn: connection.Connection, settings: BusSettings, metrics: BusMetrics
) -> None:
    async with (
        subscribing.subscribe(
            conn, settings=settings, metrics=metrics, node="a.b", kind="health"
        ) as sub,
        publishing.publisher(conn, settings=settings, metrics=metrics) as pub,
    ):
        for node in ("a.b", "a", "b"):
            for ev in testing.example_events(node):
                pub.publish(ev)
        [got] = await testing.collect(sub, 1)
        await pub.wait_sent()
        await conn.flush()
        assert sub._receive.statistics().current_buffer_used == 0
    assert isinstance(got, events.HealthEvent)
    assert got.node == "a.b"


async def test_late_subscriber_gets_retained_state_of_100_nodes(
    conn: connection.Connection, settings: BusSettings, metrics: BusMetrics
) -> None:
    nodes = [f"node-{i:03d}.cluster.local" for i in range(100)]
    async with publishing.publisher(conn, settings=settings, metrics=metrics) as pub:
        for seq in range(2):  # only the second round may be retained
            for node in nodes:
                for ev in testing.example_events(node, seq=seq):
                    pub.publish(ev)
        await pub.wait_sent()
        await conn.flush()
    expected = {(n, k) for n in nodes for k in subjects.KINDS}
    async with subscribing.subscribe(
        conn, settings=settings, metrics=metrics, include_state=True
    ) as sub:
        got = await testing.collect(sub, len(expected), timeout_s=20)
        live = testing.example_events("late-node", seq=7)[5]
        async with publishing.publisher(conn, settings=settings, metrics=metrics) as pub:
            pub.publish(live)
            [after] = await testing.collect(sub, 1)
    assert {(e.node, events.kind_of(e)) for e in got} == expected
    assert all(e.v == 1 for e in got)
    assert {e.version for e in got if isinstance(e, events.AgentEvent)} == {"0.1.1"}
    assert after == live


async def test_stream_creation_is_idempotent(
    conn: connection.Connection, settings: BusSettings
) -> None:
    await state.ensure_streams(conn, settings)
    await state.ensure_streams(conn, settings)
    changed = msgspec.structs.replace(settings, samples_max_age_s=60.0)
    await state.ensure_streams(conn, changed)
    assert await state.snapshot(conn, settings) == []


_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
)
_json_values = (
    _scalars
    | st.lists(_scalars, max_size=3)
    | st.dictionaries(st.text(max_size=6), _scalars, max_size=3)
)
_envelopes = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from([*subjects.KINDS, "gossip", ""]) | st.text(max_size=5),
        "v": st.integers(-1, 3) | st.text(max_size=2),
        "node": st.text(max_size=8),
        "ts": st.text(max_size=30),
        "groups": _json_values,
        "healthy": _json_values,
    },
).map(msgspec.json.encode)
_garbage = st.tuples(
    st.text(alphabet="abc%2E-_", min_size=1, max_size=12),
    st.sampled_from([*subjects.KINDS, "other"]),
    st.binary(max_size=64) | st.binary(min_size=600, max_size=700) | _envelopes,
)


def _generate_garbage(count: int) -> list[tuple[str, str, bytes]]:
    """Hypothesis as a generator: draw ``count`` garbage messages up front."""
    drawn: list[tuple[str, str, bytes]] = []

    @hsettings(max_examples=count, database=None, suppress_health_check=list(HealthCheck))
    @given(_garbage)
    def draw(item: tuple[str, str, bytes]) -> None:
        drawn.append(item)

    draw()
    return drawn


async def test_garbage_never_kills_a_subscriber_and_is_counted(
    conn: connection.Connection, settings: BusSettings, metrics: BusMetrics
) -> None:
    garbage = _generate_garbage(300)
    sentinels = [
        testing.example_events(f"n{i}", seq=i)[5] for i in range((len(garbage) + 49) // 50)
    ]
    small = msgspec.structs.replace(settings, max_payload_bytes=512)
    async with subscribing.subscribe(conn, settings=small, metrics=metrics) as sub:
        for i, (token, kind, payload) in enumerate(garbage):
            if i % 50 == 0:
                ev = sentinels[i // 50]
                await conn.publish(subjects.subject(ev.node, "agent"), msgspec.json.encode(ev))
            await conn.publish(f"{subjects.PREFIX}.{token}.{kind}", payload)
        marker = testing.example_events("marker")[5]
        await conn.publish(subjects.subject("marker", "agent"), msgspec.json.encode(marker))
        got: list[events.Event] = []
        while not got or got[-1] != marker:
            got.extend(await testing.collect(sub, 1))
    assert [e for e in got if e in sentinels] == sentinels
    accidental = len(got) - len(sentinels) - 1  # garbage that happened to be a valid event
    assert metrics.total_dropped() + accidental == len(garbage)
    assert metrics.total_dropped() >= len(garbage) * 0.9

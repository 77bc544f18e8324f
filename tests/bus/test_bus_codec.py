"""Codec: every event round-trips; refusals are labelled, counted and rate-limited in the log."""

from __future__ import annotations

import logging

import msgspec
import pytest

from bus import codec, events, testing
from bus.codec import DropLog
from bus.errors import DecodeFailed
from bus.metrics import BusMetrics

NODE = "ip-10-0-0-1.ec2.internal"
MAX = 1 << 20


def _decode(data: bytes, kind: str = "health", node: str = NODE) -> events.Event:
    return codec.decode(data, kind=kind, node=node, max_bytes=MAX)  # type: ignore[arg-type]


@pytest.mark.parametrize("event", testing.example_events(NODE), ids=events.kind_of)
def test_every_event_round_trips(event: events.Event) -> None:
    data = codec.encode(event)
    wire = msgspec.json.decode(data)
    assert wire["kind"] == events.kind_of(event)
    assert wire["v"] == 1
    assert wire["node"] == NODE
    assert wire["ts"] == "2026-01-01T00:00:00Z"
    assert _decode(data, events.kind_of(event)) == event


def _health_wire(**changes: object) -> dict[str, object]:
    wire = msgspec.json.decode(codec.encode(testing.example_events(NODE)[2]))
    assert isinstance(wire, dict)
    wire.update(changes)
    return wire


def test_unknown_fields_are_ignored() -> None:
    data = msgspec.json.encode(_health_wire(futureField={"x": 1}, another=[1, 2]))
    assert _decode(data) == testing.example_events(NODE)[2]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\x00garbage", "malformed"),
        (b"{}", "malformed"),
        (b"[1,2]", "malformed"),
        (msgspec.json.encode(_health_wire(healthy="yes")), "malformed"),
        (msgspec.json.encode(_health_wire(kind="gossip")), "malformed"),
        (msgspec.json.encode(_health_wire(v=2)), "version"),
        (msgspec.json.encode(_health_wire(v=2, kind="brand-new", healthy=None)), "version"),
        (msgspec.json.encode(_health_wire(kind="agent", version="1")), "malformed"),
        (msgspec.json.encode(_health_wire(node="someone-else")), "node"),
        (b" " * (MAX + 1), "oversized"),
    ],
)
def test_refusals_are_labelled(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeFailed) as info:
        _decode(data)
    assert info.value.reason == reason


def test_kind_must_match_subject() -> None:
    with pytest.raises(DecodeFailed) as info:
        _decode(codec.encode(testing.example_events(NODE)[0]), "health")
    assert info.value.reason == "kind"


def test_json_schema_covers_the_union() -> None:
    schema = codec.json_schema()
    mapping = schema["discriminator"]["mapping"]
    assert set(mapping) == {"devices", "samples", "health", "allocations", "models", "agent"}
    assert "DeviceGroup" in schema["$defs"]
    assert "MonitorSample" in schema["$defs"]
    msgspec.json.encode(schema)  # serialisable as is


def test_json_schema_describes_the_agents_records() -> None:
    """The records in GPUSTACK_V1_AGENTS are part of the contract: ``bus schema`` carries
    them, quotas included, with their camelCase wire names and only the required required."""
    defs = codec.json_schema()["$defs"]
    artifact = defs["ArtifactRecord"]
    assert set(artifact["required"]) == {"namespace", "name", "uid"}  # a hub source of either kind
    assert {"source", "modelScope"} <= set(artifact["properties"])
    assert {"sizeBytes", "quotas", "manifestDigest"} <= set(artifact["properties"])
    quota = defs["BindingQuota"]
    assert set(quota["required"]) == {"name", "stores"}
    assert set(quota["properties"]) == {"name", "stores", "quotaBytes", "usedBytes"}
    assert "store" in defs["StoreSpec"]["properties"]
    assert "PendingContainers" in defs


def test_drop_log_counts_every_drop_but_logs_once_a_minute_per_sender(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    metrics = BusMetrics()
    drops = DropLog(metrics, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="bus.codec"):
        logged = [drops.record(kind="health", reason="malformed", sender="a") for _ in range(50)]
        logged.append(drops.record(kind="health", reason="malformed", sender="b"))
        now[0] = 61.0
        logged.append(drops.record(kind="health", reason="version", sender="a"))
    assert logged.count(True) == 3
    assert len(caplog.records) == 3
    assert metrics.dropped_count("health", "malformed") == 51
    assert metrics.dropped_count("health", "version") == 1
    assert metrics.total_dropped() == 52


def test_drop_log_memory_is_bounded() -> None:
    drops = DropLog(BusMetrics(), max_senders=10, clock=lambda: 0.0)
    for i in range(1000):
        drops.record(kind="samples", reason="malformed", sender=f"s{i}")
    assert len(drops._last_logged) <= 10


def test_the_guard_refuses_future_stamps_as_its_clock_moves() -> None:
    """The cached limit never lets a far-future stamp through, whichever way the clock goes."""
    from datetime import UTC, datetime

    from bus import subjects

    clock = [1_000_000.0]
    guard = codec.Guard(
        DropLog(BusMetrics()), max_bytes=1 << 20, max_skew_s=300.0, clock=lambda: clock[0]
    )

    def at(offset: float) -> bool:
        ts = datetime.fromtimestamp(1_000_000.0 + offset, UTC)
        event = events.AgentEvent(node="n", ts=ts, version="1", started_at=ts, heartbeat_s=30.0)
        return guard.accept(subjects.subject("n", "agent"), codec.encode(event)) is not None

    assert at(299) and not at(301)
    clock[0] += 0.5  # within the cached second: the closer look decides
    assert at(300.4) and not at(300.6)
    clock[0] += 10
    assert at(309) and not at(311)
    clock[0] -= 100  # the clock went back: the limit follows it
    assert at(209) and not at(211)
    naive = events.AgentEvent(
        node="n", ts=datetime(2100, 1, 1), version="1", started_at=datetime(2100, 1, 1),
        heartbeat_s=30.0,
    )  # fmt: skip
    assert guard.accept(subjects.subject("n", "agent"), codec.encode(naive)) is None


# --- recalling restatements (Guard memo_kinds) ---------------------------------------------------


def _memo_guard(**kwargs: object) -> tuple[codec.Guard, BusMetrics]:
    metrics = BusMetrics()
    guard = codec.Guard(
        DropLog(metrics), max_bytes=4096, max_skew_s=300.0,
        memo_kinds=codec.REPEATED_KINDS, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    return guard, metrics


def _restamped(event: events.Event, seconds: float) -> tuple[events.Event, bytes]:
    from datetime import timedelta

    moved = msgspec.structs.replace(event, ts=event.ts + timedelta(seconds=seconds))
    return moved, codec.encode(moved)


@pytest.mark.parametrize(
    "event",
    [e for e in testing.example_events(NODE) if events.kind_of(e) in codec.REPEATED_KINDS],
    ids=events.kind_of,
)
def test_a_restatement_is_recalled_and_equals_a_full_decode(event: events.Event) -> None:
    """The second payload differs only in its stamp: the guard returns the first event with
    the new stamp (sharing its fields: it did not decode) and it equals a full decode."""
    from bus import subjects

    guard, metrics = _memo_guard()
    subj = subjects.subject(NODE, events.kind_of(event))
    first = guard.accept(subj, codec.encode(event))
    assert first == event
    for seconds in (1.0, 0.000001, 86400.0 * 30):
        moved, data = _restamped(event, seconds)
        again = guard.accept(subj, data)
        assert again == moved == _decode(data, events.kind_of(event))
        assert again is not None and again.ts == moved.ts
        assert all(getattr(again, f) is getattr(first, f) for f in again.__struct_fields__[3:])
    assert metrics.total_dropped() == 0


def test_samples_are_always_decoded() -> None:
    from bus import subjects

    guard, _ = _memo_guard()
    event = testing.example_events(NODE)[1]
    subj = subjects.subject(NODE, "samples")
    first = guard.accept(subj, codec.encode(event))
    again = guard.accept(subj, _restamped(event, 1.0)[1])
    assert first is not None and again is not None
    assert again.samples == first.samples and again.samples is not first.samples  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("stamp", "reason"),
    [
        (b"2999-01-01T00:00:00Z", "future"),
        (b"yesterday", "malformed"),
        (b"2026-01-01T00:00:00Z\\", "malformed"),
        (b"2026-01-01T00:00:00Z" + b" " * 5000, "oversized"),
    ],
)
def test_what_a_decode_refuses_a_restatement_cannot_slip_through(stamp: bytes, reason: str) -> None:
    """Only the stamp differs, but it is one a full decode refuses: refused and counted the same."""
    from bus import subjects

    guard, metrics = _memo_guard()
    event = testing.example_events(NODE)[0]
    subj = subjects.subject(NODE, "devices")
    data = codec.encode(event)
    assert guard.accept(subj, data) is not None
    old = b'"2026-01-01T00:00:00Z"'
    assert data.count(old) == 1
    assert guard.accept(subj, data.replace(old, b'"' + stamp + b'"')) is None
    assert metrics.dropped_count("devices", reason) == 1
    assert guard.accept(subj, data) == event  # the memory still holds the good one


def test_a_non_canonical_payload_is_decoded_every_time() -> None:
    """A duplicate ``ts`` (escaped, so it is the one that counts) or an unknown field: nothing is
    remembered, and each payload is what a full decode makes of it."""
    from bus import subjects

    guard, _ = _memo_guard()
    event = testing.example_events(NODE)[0]
    subj = subjects.subject(NODE, "devices")
    data = codec.encode(event)
    dup = data[:-1] + b',"t\\u0073":"2020-01-01T00:00:00Z"}'
    for stamp in (b"2026-01-01T00:00:00Z", b"2026-01-02T00:00:00Z", b"2026-01-03T00:00:00Z"):
        payload = dup.replace(b"2026-01-01T00:00:00Z", stamp, 1)
        got = guard.accept(subj, payload)
        assert got == _decode(payload, "devices")
        assert got is not None and got.ts.year == 2020
    extra = data[:-1] + b',"futureField":1}'
    assert guard.accept(subj, extra) == event
    assert guard._memo == {}


def test_a_changed_payload_replaces_the_memory_and_the_memory_is_bounded() -> None:
    from bus import subjects

    guard, _ = _memo_guard(memo_entries=2)
    for seq in range(3):
        for node in ("a", "b", "c"):
            event = testing.example_events(node, seq=seq)[0]
            got = guard.accept(subjects.subject(node, "devices"), codec.encode(event))
            assert got == event  # a changed spec is never the remembered one
    assert len(guard._memo) == 2

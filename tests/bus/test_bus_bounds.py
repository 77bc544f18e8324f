"""Semantic bounds: an event valid by type but absurd is dropped and counted like a malformed one,
by the one guard every subscriber and retained-state reader uses; honest events pass."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from bus import codec, connection, events, publishing, subjects, subscribing, testing
from bus.codec import DropLog
from bus.metrics import BusMetrics
from bus.settings import BusSettings

NODE = "node-a"
MAX = 4 * 1024 * 1024  # above the 1 MB strings, so the size rule is not what refuses them

Wire = dict[str, Any]


def _wire(kind: str) -> Wire:
    event = next(e for e in testing.example_events(NODE) if events.kind_of(e) == kind)
    wire = msgspec.json.decode(codec.encode(event))
    assert isinstance(wire, dict)
    return wire


def _group(w: Wire) -> Wire:
    group: Wire = w["groups"][0]
    return group


def _card_sample(w: Wire) -> Wire:
    card: Wire = w["samples"][0]["accelerators"][0]
    return card


def _set(path: Callable[[Wire], Wire], key: str, value: object) -> Callable[[Wire], None]:
    def change(w: Wire) -> None:
        path(w)[key] = value

    return change


def _top(w: Wire) -> Wire:
    return w


def _model(w: Wire) -> Wire:
    model: Wire = w["models"][0]
    return model


LIES: list[tuple[str, str, Callable[[Wire], None]]] = [
    ("devices", "negative-memory", _set(_group, "memory", -143771)),
    ("devices", "huge-memory", _set(_group, "memory", 10**30)),
    ("devices", "1MB-name", _set(_group, "name", "x" * 1_000_000)),
    ("devices", "negative-index", lambda w: _group(w)["accelerators"][0].update(index=-1)),
    (
        "devices",
        "2000-cards",
        lambda w: _group(w).update(accelerators=_group(w)["accelerators"] * 2000),
    ),
    ("samples", "huge-temperature", _set(_card_sample, "temperature", 10**30)),
    ("samples", "below-absolute-zero", _set(_card_sample, "temperature", -300)),
    ("samples", "negative-power", _set(_card_sample, "powerUsage", -5)),
    ("samples", "101-percent", _set(_card_sample, "coresUtilization", 101)),
    ("samples", "ratio-over-1", _set(_card_sample, "smActive", 1.5)),
    ("samples", "zero-period", _set(_top, "periodS", 0)),
    ("samples", "used-over-16TiB", _set(_card_sample, "memoryUsage", 2**45)),
    ("health", "1MB-message", _set(_top, "message", "m" * 1_000_000)),
    ("allocations", "over-a-card", _set(_top, "charges", [{"acceleratorId": "a", "units": 10**9}])),
    ("allocations", "negative-memory", _set(_top, "memoryMib", -1)),
    ("models", "negative-bytes", _set(_model, "bytesDone", -1)),
    ("models", "huge-capacity", _set(_top, "capacityBytes", 10**30)),
    ("agent", "100-capabilities", _set(_top, "capabilities", ["c"] * 100)),
    ("agent", "year-long-heartbeat", _set(_top, "heartbeatS", 3.2e7)),
]


@pytest.mark.parametrize(("kind", "lie", "change"), LIES, ids=[f"{k}-{n}" for k, n, _ in LIES])
def test_an_absurd_value_is_dropped_and_counted_as_malformed(
    kind: str, lie: str, change: Callable[[Wire], None], caplog: pytest.LogCaptureFixture
) -> None:
    metrics = BusMetrics()
    guard = codec.Guard(DropLog(metrics), max_bytes=MAX, max_skew_s=300.0)
    subject = subjects.subject(NODE, kind)  # type: ignore[arg-type]
    wire = _wire(kind)
    honest = guard.accept(subject, msgspec.json.encode(wire))
    change(wire)

    with caplog.at_level(logging.WARNING, logger="bus.codec"):
        refused = guard.accept(subject, msgspec.json.encode(wire))

    assert honest is not None and refused is None
    assert metrics.dropped_count(kind, "malformed") == 1
    assert metrics.total_dropped() == 1
    assert f"dropped a {kind} message from {NODE}: malformed" in caplog.text


def test_bounds_are_in_the_published_schema() -> None:
    defs = codec.json_schema()["$defs"]
    memory = defs["DeviceGroup"]["properties"]["memory"]["anyOf"][0]
    assert (memory["minimum"], memory["maximum"]) == (0, 16 * 1024 * 1024)
    assert defs["DeviceGroup"]["properties"]["name"]["maxLength"] == 256
    assert defs["AcceleratorSample"]["properties"]["temperature"]["anyOf"][0]["maximum"] == 500


def test_limits_of_real_hardware_pass() -> None:
    """The largest values today's cards report are well inside: a B300's 288 GB, an MI355X's
    1.4 kW, a card at 100 % and 110 degrees, a counter near the int64 edge."""
    wire = _wire("samples")
    _card_sample(wire).update(
        memory=294_912, memoryUsage=294_912, powerUsage=1_400, coresUtilization=100,
        temperature=110, energy=2**62, smActive=1.0, nvlinkTx=2**62,
    )  # fmt: skip
    devices = _wire("devices")
    _group(devices).update(memory=294_912, cores=256)

    samples = codec.decode(msgspec.json.encode(wire), kind="samples", node=NODE, max_bytes=MAX)
    group = codec.decode(msgspec.json.encode(devices), kind="devices", node=NODE, max_bytes=MAX)

    assert isinstance(samples, events.SamplesEvent) and isinstance(group, events.DevicesEvent)
    assert samples.samples[0].accelerators[0].power_usage == 1_400
    assert group.groups[0].memory == 294_912


@pytest.mark.anyio
async def test_a_lie_does_not_replace_a_nodes_retained_state_on_a_real_server(
    conn: connection.Connection, settings: BusSettings, metrics: BusMetrics
) -> None:
    """Through a nats-server, as a worker meets it: the node's last valid devices stay its
    retained state, and the lie published after them is dropped and counted as malformed."""
    real = testing.example_events(NODE)[0]
    assert isinstance(real, events.DevicesEvent)
    lie = msgspec.structs.replace(
        real, groups=(msgspec.structs.replace(real.groups[0], memory=-143771),)
    )
    async with publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub:
        pub.publish(real)
        await pub.wait_sent()
    await conn.publish_acked(subjects.subject(NODE, "devices"), codec.encode(lie))

    async with subscribing.subscribe(
        conn, settings=settings, metrics=metrics, include_state=True
    ) as sub:
        (first,) = await testing.collect(sub, 1, timeout_s=3)

    assert first == real
    assert metrics.dropped_count("devices", "malformed") == 1

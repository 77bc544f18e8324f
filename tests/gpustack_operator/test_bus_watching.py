"""``bus watch``: retained state first, then live events; JSON relays the payload as it came."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import yaml

from bus import codec, connection, events, publishing, subjects, testing
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from gpustack_operator import buswatching, buswide

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


@pytest.fixture
async def settings(tmp_path: Path) -> AsyncIterator[BusSettings]:
    async with testing.nats_server(tmp_path) as server:
        yield testing.settings_for(server)


class _Sink(io.RawIOBase):
    """What reached the OS: only bytes a flush (or a full buffer) pushed out."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.data += bytes(b)
        self.writes += 1
        return len(b)


def _stdout() -> tuple[_Sink, io.BufferedWriter]:
    sink = _Sink()
    return sink, io.BufferedWriter(sink, buffer_size=1 << 16)


async def _publish_examples(
    settings: BusSettings, nodes: tuple[str, ...] = ("a.one", "b.two")
) -> None:
    async with (
        connection.connect(settings) as conn,
        publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
    ):
        for node in nodes:
            for ev in testing.example_events(node):
                pub.publish(ev)
        await pub.wait_sent()
        await conn.flush()


async def _watch_until(
    settings: BusSettings,
    lines: int,
    *,
    first: int | None = None,
    fmt: str = "json",
    live: list[tuple[str, bytes]] = (),  # type: ignore[assignment]
    tty: bool = False,
    **kw: Any,
) -> _Sink:
    """Run watch until ``lines`` lines reached the sink, publishing ``live`` once ``first``
    lines (default: all but one per live message) are out."""
    sink, out = _stdout()
    await _publish_examples(settings)
    async with connection.connect(settings) as conn, anyio.create_task_group() as tg:
        tg.start_soon(lambda: buswatching.watch(settings=settings, fmt=fmt, out=out, tty=tty, **kw))

        async def shown(n: int) -> bool:
            return sink.data.count(b"\n") >= n

        await testing.eventually(lambda: shown(lines - len(live) if first is None else first))
        for subject, payload in live:
            await conn.publish(subject, payload)
        await testing.eventually(lambda: shown(lines))
        tg.cancel_scope.cancel()
    return sink


async def test_json_prints_state_then_live_and_flushes_when_idle(settings: BusSettings) -> None:
    live = testing.example_events("a.one", seq=9)[5]
    subject = subjects.subject("a.one", "agent")
    sink = await _watch_until(
        settings, 13, live=[(subject, codec.encode(live))], node=None, subject=None
    )
    # Everything is visible without the watch ending: flushed once nothing more was waiting
    # (a 64 KiB buffer would otherwise still hold these few lines).
    lines = bytes(sink.data).splitlines()
    assert len(lines) == 13
    docs = [msgspec.json.decode(line, type=events.Event) for line in lines]
    assert {(d.node, events.kind_of(d)) for d in docs[:12]} == {
        (n, k) for n in ("a.one", "b.two") for k in subjects.KINDS
    }
    assert isinstance(docs[-1], events.AgentEvent) and docs[-1].version == "0.1.9"


async def test_json_writes_the_payload_as_it_arrived(settings: BusSettings) -> None:
    """Validated, not re-encoded: key order, spacing and unknown fields pass through."""
    event = testing.example_events("a.one", seq=3)[2]
    wire = msgspec.json.decode(codec.encode(event))
    payload = b'{"zNewField": [1, 2],  ' + msgspec.json.encode(wire)[1:]
    assert msgspec.json.decode(payload, type=events.Event) == event  # a valid event
    sink = await _watch_until(
        settings,
        2,
        live=[(subjects.subject("a.one", "health"), payload)],
        node="a.one",
        subject=None,
        kind="health",
    )
    assert bytes(sink.data).splitlines()[-1] == payload


async def test_json_refuses_garbage_and_keeps_one_event_per_line(settings: BusSettings) -> None:
    event = testing.example_events("a.one", seq=5)[5]
    pretty = msgspec.json.format(codec.encode(event), indent=2)  # valid, with line breaks
    subject = subjects.subject("a.one", "agent")
    sink = await _watch_until(
        settings,
        2,
        first=1,
        live=[(subject, b"not json"), (subject, b'{"kind":"agent"}'), (subject, pretty)],
        node="a.one",
        subject="gpustack.v1.node.*.agent",
    )
    lines = bytes(sink.data).splitlines()
    assert len(lines) == 2  # the retained agent event, then only the valid live one
    assert msgspec.json.decode(lines[1], type=events.Event) == event


async def test_a_terminal_sees_every_event_flushed(settings: BusSettings) -> None:
    sink = await _watch_until(settings, 12, tty=True, node=None, subject=None)
    assert sink.writes >= 12  # one flush per event; off a terminal, a burst is one write


async def test_yaml_with_a_subject_filter(settings: BusSettings) -> None:
    live = testing.example_events("a.one", seq=9)[5]
    state = testing.example_events("a.one")[5]
    first = buswatching.format_event(state, "yaml").count("\n")
    sink = await _watch_until(
        settings,
        first + buswatching.format_event(live, "yaml").count("\n"),
        first=first,
        fmt="yaml",
        live=[(subjects.subject("a.one", "agent"), codec.encode(live))],
        node=None,
        subject="gpustack.v1.node.a%2Eone.agent",
    )
    docs = [d for d in yaml.safe_load_all(bytes(sink.data)) if d]
    assert [(d["node"], d["kind"], d["version"]) for d in docs] == [
        ("a.one", "agent", "0.1.0"),
        ("a.one", "agent", "0.1.9"),
    ]


async def test_wide_is_a_table_with_one_row_per_event(settings: BusSettings) -> None:
    sink = await _watch_until(settings, 7, fmt="wide", node="b.two", subject=None)
    header, *rows = bytes(sink.data).decode().splitlines()
    assert header.split() == ["TIME", "NODE", "KIND", "SUMMARY"]
    assert {r.split()[2] for r in rows} == set(subjects.KINDS)
    by_kind = {r.split()[2]: r for r in rows}
    assert all(r.split()[:2] == ["2026-01-01T00:00:00Z", "b.two"] for r in rows)
    assert "1 x NVIDIA H200 (140.4 GiB each)" in by_kind["devices"]
    assert "GPU-b.two-0 healthy XID xid=79" in by_kind["health"]
    assert "1 downloading (0 B of 1000 B, 0%)" in by_kind["models"]


async def test_kind_keeps_to_one_kind(settings: BusSettings) -> None:
    sink = await _watch_until(settings, 2, node=None, subject=None, kind="health")
    docs = [msgspec.json.decode(x, type=events.Event) for x in bytes(sink.data).splitlines()]
    assert {(d.node, events.kind_of(d)) for d in docs} == {
        ("a.one", "health"),
        ("b.two", "health"),
    }


async def test_once_prints_the_retained_state_and_returns(settings: BusSettings) -> None:
    await _publish_examples(settings)
    sink, out = _stdout()
    with anyio.fail_after(20):
        await buswatching.watch(
            settings=settings, node=None, subject=None, fmt="json", out=out, once=True
        )
    lines = bytes(sink.data).splitlines()
    assert len(lines) == 12
    assert {msgspec.json.decode(x)["kind"] for x in lines} == set(subjects.KINDS)


async def test_filters_that_exclude_each_other_print_nothing(settings: BusSettings) -> None:
    sink, out = _stdout()
    await buswatching.watch(
        settings=settings,
        node=None,
        subject="gpustack.v1.node.*.devices",
        kind="health",
        fmt="json",
        out=out,
    )
    assert sink.data == b""


async def test_watch_refuses_unknown_format(settings: BusSettings) -> None:
    with pytest.raises(ValueError, match="unknown format"):
        await buswatching.watch(
            settings=settings, node=None, subject=None, fmt="xml", out=io.BytesIO()
        )


def test_wide_summaries_of_every_kind() -> None:
    rows = [buswide.summary(e) for e in testing.example_events("n", seq=500)]
    assert rows == [
        "1 x NVIDIA H200 (140.9 GiB each)",
        "1 nvidia, util 96%",
        "GPU-n-0 healthy XID xid=79",
        "allocated nvidia.com/gpu 1 device(s) <none>",
        "1 downloading (500 B of 1000 B, 50%)",
        "version 0.1.500, up since 2026-01-01T00:00:00Z, heartbeat 30s",
    ]


async def test_the_state_is_printed_again_after_a_reconnect(tmp_path: Path) -> None:
    """What was published while the watch was away arrives after its reconnect, from the
    retained state, not only at the sender's next publish."""
    async with testing.nats_server(tmp_path) as server:
        settings = testing.settings_for(server)
        slow = testing.settings_for(server, reconnect_wait_s=1.5)  # back after the publisher
        await _publish_examples(settings, nodes=("a.one",))
        sink, out = _stdout()

        async def shown(n: int) -> bool:
            return sink.data.count(b"\n") >= n

        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: buswatching.watch(
                    settings=slow, node=None, subject=None, kind="agent", fmt="json", out=out
                )
            )
            await testing.eventually(lambda: shown(1))
            await server.restart()  # the store is kept
            later = testing.example_events("a.one", seq=7)[5]
            async with (
                connection.connect(settings) as conn,
                publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
            ):
                pub.publish(later)
                await pub.wait_sent()
            await testing.eventually(lambda: shown(2), timeout_s=20)
            tg.cancel_scope.cancel()
    first, second = (
        msgspec.json.decode(x, type=events.Event) for x in bytes(sink.data).splitlines()[:2]
    )
    assert isinstance(second, events.AgentEvent) and second.version == "0.1.7"
    assert isinstance(first, events.AgentEvent) and first.version == "0.1.0"

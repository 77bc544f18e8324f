"""``bus watch``: retained state first, then live events, one document per line."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import msgspec
import pytest
import yaml

from bus import connection, events, publishing, testing
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from gpustack_operator import buswatching

pytestmark = pytest.mark.anyio


@pytest.fixture
async def settings(tmp_path: Path) -> AsyncIterator[BusSettings]:
    async with testing.nats_server(tmp_path) as server:
        yield testing.settings_for(server)


class _Lines(io.StringIO):
    """Captures output and counts flushes (watch must flush per event)."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


async def _run_watch(settings: BusSettings, fmt: str, until: int, **kw: str | None) -> _Lines:
    out = _Lines()
    async with (
        connection.connect(settings) as conn,
        publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
    ):
        for node in ("a.one", "b.two"):
            for ev in testing.example_events(node):
                pub.publish(ev)
        await pub.wait_sent()
        await conn.flush()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: buswatching.watch(
                    settings=settings,
                    node=kw.get("node"),
                    subject=kw.get("subject"),
                    fmt=fmt,
                    out=out,
                )
            )

            def flushed(n: int) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    return out.flushes >= n

                return check

            await testing.eventually(flushed(until - 1))
            pub.publish(testing.example_events("a.one", seq=9)[5])  # a live one
            await testing.eventually(flushed(until))
            tg.cancel_scope.cancel()
    return out


async def test_watch_json_prints_state_then_live(settings: BusSettings) -> None:
    out = await _run_watch(settings, "json", until=13)
    lines = out.getvalue().splitlines()
    assert len(lines) == out.flushes == 13
    docs = [msgspec.json.decode(line, type=events.Event) for line in lines]
    assert {(d.node, events.kind_of(d)) for d in docs[:12]} == {
        (n, k)
        for n in ("a.one", "b.two")
        for k in ("devices", "samples", "health", "allocations", "models", "agent")
    }
    assert isinstance(docs[-1], events.AgentEvent)
    assert docs[-1].version == "0.1.9"


async def test_watch_yaml_with_a_subject_filter(settings: BusSettings) -> None:
    out = await _run_watch(settings, "yaml", until=2, subject="gpustack.v1.node.a%2Eone.agent")
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    assert [(d["node"], d["kind"], d["version"]) for d in docs] == [
        ("a.one", "agent", "0.1.0"),
        ("a.one", "agent", "0.1.9"),
    ]


async def test_watch_refuses_unknown_format(settings: BusSettings) -> None:
    with pytest.raises(ValueError, match="unknown format"):
        await buswatching.watch(
            settings=settings, node=None, subject=None, fmt="xml", out=io.StringIO()
        )

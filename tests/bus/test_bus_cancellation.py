"""Every stateful bus component, cancelled mid-operation at several delays, against a real server.

Invariants checked after each cancellation: no task of ours is left running, no socket is left
open in this process, no ``nats-server`` child survives, and a cancelled publisher has stored
every state event it accepted (its flush is shielded and bounded), after which ``publish``
raises :class:`PublisherClosed`.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from bus import (
    codec,
    connection,
    embedded,
    events,
    publishing,
    state,
    subjects,
    subscribing,
    testing,
)
from bus.errors import PublisherClosed
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from gpustack_operator import buswatching
from kit import testing as testing_fds

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

DELAYS = [0.0, 0.002, 0.01, 0.05]


def _server_children() -> list[int]:
    """Pids of live ``nats-server`` processes whose parent is this process."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and stat[0] != "Z" and b"nats-server" in cmdline:
            found.append(int(proc.name))
    return found


class Baseline:
    """What existed before the operation: tasks and sockets of this process."""

    def __init__(self) -> None:
        gc.collect()
        self.tasks = asyncio.all_tasks()
        self.sockets = testing_fds.socket_fds()

    async def check(self) -> None:
        """Nothing new is left (bounded wait: closing clients finish their tasks in a few ticks)."""

        async def clean() -> bool:
            gc.collect()  # an unclosed transport would warn here (warnings are errors)
            return not self.leftover_tasks() and testing_fds.socket_fds() <= self.sockets

        try:
            await testing.eventually(clean, timeout_s=5, interval_s=0.01)
        except TimeoutError:
            pytest.fail(f"left behind: {self.leftover_tasks()}, sockets {testing_fds.socket_fds()}")

    def leftover_tasks(self) -> set[asyncio.Task[object]]:
        current = asyncio.current_task()
        return {t for t in asyncio.all_tasks() - self.tasks if t is not current and not t.done()}


@pytest.fixture
def many(settings: BusSettings) -> list[events.Event]:
    """State and samples of 60 nodes: enough that every operation takes a few loop turns."""
    return [ev for i in range(60) for ev in testing.example_events(f"node-{i}.local", seq=i)]


async def _retain(settings: BusSettings, evs: list[events.Event]) -> None:
    async with (
        connection.connect(settings, retry=False) as conn,
        publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
    ):
        for ev in evs:
            pub.publish(ev)
        await pub.wait_sent()
        await conn.flush()


@pytest.mark.parametrize("delay", DELAYS)
async def test_cancel_connect(settings: BusSettings, delay: float) -> None:
    base = Baseline()
    with anyio.move_on_after(delay):
        async with connection.connect(settings, retry=False) as conn:
            await conn.flush()
            await anyio.sleep(5)
    await base.check()


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3])
async def test_cancel_connect_while_retrying_a_dead_server(delay: float) -> None:
    dead = BusSettings.for_tests(f"nats://127.0.0.1:{embedded.free_port()}")
    base = Baseline()
    with anyio.move_on_after(delay):
        async with connection.connect(dead, retry=True):
            pytest.fail("connected to nothing")
    await base.check()


@pytest.mark.parametrize("delay", DELAYS)
async def test_cancel_publisher_keeps_every_accepted_state_event(
    settings: BusSettings, many: list[events.Event], delay: float
) -> None:
    base = Baseline()
    accepted: list[events.Event] = []
    async with connection.connect(settings, retry=False) as conn:
        with anyio.move_on_after(delay):
            async with publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub:
                for ev in many:
                    pub.publish(ev)
                    accepted.append(ev)
                    # Cancelled somewhere in the middle of publishing.
                    await anyio.lowlevel.checkpoint()
                await anyio.sleep(5)
        assert pub.closed
        assert pub.pending == 0  # flushed on the way out, cancellation notwithstanding
        with pytest.raises(PublisherClosed):
            pub.publish(many[0])
        stored = dict(await state.snapshot(conn, settings))
    for ev in accepted:
        if not isinstance(ev, events.SamplesEvent):
            subject = subjects.subject(ev.node, events.kind_of(ev))
            assert subject in stored, subject
            assert (
                codec.decode(
                    stored[subject], kind=events.kind_of(ev), node=ev.node, max_bytes=1 << 20
                )
                == ev
            )
    await base.check()


@pytest.mark.parametrize("delay", DELAYS)
async def test_cancel_link_flushes_every_accepted_state_event(
    settings: BusSettings, many: list[events.Event], delay: float
) -> None:
    base = Baseline()
    accepted: list[events.Event] = []
    async with publishing.publisher(settings=settings, metrics=BusMetrics()) as pub:
        async with anyio.create_task_group() as tg:
            tg.start_soon(publishing.link, pub, settings)
            await testing.eventually(_attached(pub))
            with anyio.move_on_after(delay):
                for ev in many:
                    pub.publish(ev)
                    accepted.append(ev)
                    await anyio.lowlevel.checkpoint()
                await anyio.sleep(5)
            tg.cancel_scope.cancel()
        assert not pub.attached
        assert pub.pending == 0  # flushed on the way out of the link
    async with connection.connect(settings, retry=False) as conn:
        stored = dict(await state.snapshot(conn, settings))
    assert accepted
    for ev in accepted:
        if isinstance(ev, events.DevicesEvent):
            subject = subjects.subject(ev.node, "devices")
            raw = stored[subject]
            assert codec.decode(raw, kind="devices", node=ev.node, max_bytes=1 << 20) == ev
    await base.check()


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3])
async def test_cancel_link_to_a_dead_server_keeps_the_outbox(
    many: list[events.Event], delay: float
) -> None:
    dead = BusSettings.for_tests(f"nats://127.0.0.1:{embedded.free_port()}")
    base = Baseline()
    async with publishing.publisher(settings=dead, metrics=BusMetrics()) as pub:
        for ev in many:
            pub.publish(ev)
        queued = pub.pending
        with anyio.move_on_after(delay):
            await publishing.link(pub, dead)
        assert (pub.pending, pub.attached) == (queued, False)
    await base.check()


def _attached(pub: publishing.Publisher) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pub.attached

    return check


@pytest.mark.parametrize("delay", DELAYS)
async def test_cancel_subscribe_with_state(
    settings: BusSettings, many: list[events.Event], delay: float
) -> None:
    await _retain(settings, many)
    base = Baseline()
    async with connection.connect(settings, retry=False) as conn:
        with anyio.move_on_after(delay):
            async with subscribing.subscribe(
                conn, settings=settings, metrics=BusMetrics(), include_state=True
            ) as sub:
                await testing.collect(sub, len(many) + 1, timeout_s=10)
        # The connection is still good for a new subscription after the cancelled one.
        async with subscribing.subscribe(
            conn, settings=settings, metrics=BusMetrics(), include_state=True
        ) as sub:
            assert len(await testing.collect(sub, len(many))) == len(many)
    await base.check()


@pytest.mark.parametrize("delay", DELAYS)
async def test_cancel_watch(settings: BusSettings, many: list[events.Event], delay: float) -> None:
    await _retain(settings, many)
    base = Baseline()
    out = io.BytesIO()  # the watch writes bytes, as stdout's buffer takes them
    with anyio.move_on_after(delay):
        await buswatching.watch(settings=settings, node=None, subject=None, fmt="json", out=out)
    # Whatever was printed is whole lines (a cancelled write never leaves half a document).
    text = out.getvalue()
    assert text == b"" or text.endswith(b"\n")
    await base.check()


@pytest.mark.parametrize("delay", DELAYS)
async def test_cancel_ensure_streams(settings: BusSettings, delay: float) -> None:
    base = Baseline()
    async with connection.connect(settings, retry=False) as conn:
        with anyio.move_on_after(delay):
            await state.ensure_streams(conn, settings)
        await state.ensure_streams(conn, settings)  # still idempotent after a half-done run
        assert await state.snapshot(conn, settings) == []
    await base.check()


@pytest.mark.parametrize("delay", DELAYS)
async def test_cancel_snapshot(
    conn: connection.Connection, settings: BusSettings, many: list[events.Event], delay: float
) -> None:
    await _retain(settings, many)
    # The client's shared request subscription (one per connection) exists from here on.
    await state.snapshot(conn, settings, node="warm-up")
    base = Baseline()
    with anyio.move_on_after(delay):
        await state.snapshot(conn, settings)
    await base.check()
    assert len(await state.snapshot(conn, settings)) == len(many)


@pytest.mark.parametrize("delay", DELAYS)
async def test_cancel_kv_keys(conn: connection.Connection, delay: float) -> None:
    await conn.buckets.ensure("CANCEL_KEYS")
    for i in range(300):
        await conn.buckets.put("CANCEL_KEYS", f"k.{i}", b"v")
    base = Baseline()
    with anyio.move_on_after(delay):
        await conn.buckets.keys("CANCEL_KEYS")
    # The key watcher of a cancelled listing is stopped: no heartbeat task left behind.
    await base.check()
    assert len(await conn.buckets.keys("CANCEL_KEYS", "k.>")) == 300


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.2])
async def test_cancel_embedded_server_leaves_no_process(tmp_path: Path, delay: float) -> None:
    base = Baseline()
    started: list[embedded.ServerProcess] = []
    with anyio.move_on_after(delay):
        async with embedded.embedded_server(tmp_path / "s") as server:
            started.append(server)
            await anyio.sleep(5)
    assert not any(s.running for s in started)
    assert _server_children() == []
    await base.check()

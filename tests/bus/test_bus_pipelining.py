"""Pipelined state events against a real server: order per subject, nothing acked lost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import msgspec
import pytest

from bus import acking, connection, events, publishing, state, subjects, testing
from bus.embedded import ServerProcess
from bus.metrics import BusMetrics
from bus.settings import BusSettings

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

Send = Callable[[acking.AckWindow, str, bytes, acking.OnDone], Awaitable[None]]


def _watch_sends(monkeypatch: pytest.MonkeyPatch, after_send: Callable[[int, int], None]) -> None:
    """Call ``after_send(sends so far, flights open)`` after every pipelined send."""
    original: Send = acking.AckWindow.send
    count = 0

    async def send(
        self: acking.AckWindow, subject: str, payload: bytes, done: acking.OnDone
    ) -> None:
        nonlocal count
        await original(self, subject, payload, done)
        count += 1
        after_send(count, len(self))

    monkeypatch.setattr(acking.AckWindow, "send", send)


def _health(node: str, accel: str, seq: int) -> events.HealthEvent:
    ev = testing.example_events(node, seq=seq)[2]
    assert isinstance(ev, events.HealthEvent)
    return msgspec.structs.replace(ev, accelerator_id=accel, reason=f"r{seq}")


async def _history(conn: connection.Connection, settings: BusSettings, node: str) -> list[str]:
    raw = await state.history(conn, settings, node=node, kind="health")
    return [str(msgspec.json.decode(data)["reason"]) for _, data in raw]


def _first_occurrences(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


async def test_versions_of_one_key_and_many_keys_keep_their_order(
    conn: connection.Connection,
    settings: BusSettings,
    metrics: BusMetrics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    widest = 0

    def seen(_: int, flights: int) -> None:
        nonlocal widest
        widest = max(widest, flights)

    _watch_sends(monkeypatch, seen)
    nodes = [f"n{i}.example.com" for i in range(40)]
    wide = msgspec.structs.replace(settings, publish_window=16)
    published: dict[str, list[str]] = {n: [] for n in nodes[:4]}
    async with publishing.publisher(conn, settings=wide, metrics=metrics) as pub:
        for seq in range(60):
            pub.publish(testing.example_events("hot", seq=seq)[5])  # one key, many versions
            for node in nodes:
                pub.publish(testing.example_events(node, seq=seq)[0])
            for node in nodes[:4]:  # several keys on one subject: a transition history
                ev = _health(node, f"GPU-{seq % 3}", seq)
                pub.publish(ev)
                published[node].append(ev.reason or "")
            if seq % 7 == 0:
                await anyio.lowlevel.checkpoint()  # let the window fill and drain in between
        await pub.wait_sent()
    assert widest > 1  # acknowledgements really were awaited several at a time
    latest = {
        subj: msgspec.json.decode(data) for subj, data in await state.snapshot(conn, settings)
    }
    assert latest[subjects.subject("hot", "agent")]["version"] == "0.1.59"
    for node in nodes:
        assert latest[subjects.subject(node, "devices")]["groups"][0]["memory"] == 143771 + 59
    for node, reasons in published.items():
        stored = await _history(conn, settings, node)
        assert stored[-1] == reasons[-1]
        positions = [reasons.index(r) for r in stored]
        assert positions == sorted(positions)  # a subsequence: never an older after a newer


async def test_server_killed_mid_window_loses_nothing_acked_and_delivers_the_latest(
    server: ServerProcess, metrics: BusMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = testing.settings_for(server, publish_window=32)

    def kill_mid_window(sends: int, flights: int) -> None:
        if sends == 150 and flights > 1:
            server.kill()  # SIGKILL, with acknowledgements outstanding

    _watch_sends(monkeypatch, kill_mid_window)
    nodes = [f"gpu-{i}" for i in range(10)]
    transitions: dict[str, list[str]] = {n: [] for n in nodes}
    last_devices: dict[str, int] = {}
    async with (
        connection.connect(settings) as conn,
        publishing.publisher(conn, settings=settings, metrics=metrics) as pub,
    ):
        for seq in range(40):
            for node in nodes:
                # A new accelerator id each time: nothing coalesces, every transition must land.
                ev = _health(node, f"GPU-{seq}", seq)
                pub.publish(ev)
                transitions[node].append(ev.reason or "")
                pub.publish(testing.example_events(node, seq=seq)[0])
                last_devices[node] = seq
            await anyio.sleep(0.005)
        assert not server.running
        await server.restart()
        with anyio.fail_after(20):
            await pub.wait_sent()
        latest = {
            subj: msgspec.json.decode(data) for subj, data in await state.snapshot(conn, settings)
        }
        for node in nodes:
            # Duplicates are allowed (stored, then the ack died with the server); loss is not.
            assert _first_occurrences(await _history(conn, settings, node)) == transitions[node]
            memory = latest[subjects.subject(node, "devices")]["groups"][0]["memory"]
            assert memory == 143771 + last_devices[node]

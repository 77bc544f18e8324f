"""A publisher before, between and after connections, against a real nats-server.

The publisher exists first; :func:`publishing.link` brings the connection whenever the server
answers. What was published meanwhile obeys the outbox's rules: state coalesced per key (the
latest of every key is stored), samples bounded (the oldest dropped and counted).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec
import pytest

from bus import connection, embedded, events, publishing, state, subjects, testing
from bus.errors import PublisherClosed
from bus.metrics import BusMetrics
from bus.settings import BusSettings

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


def _health(node: str, accel: str, seq: int) -> events.HealthEvent:
    ev = testing.example_events(node, seq=seq)[2]
    assert isinstance(ev, events.HealthEvent)
    return msgspec.structs.replace(ev, accelerator_id=accel, reason=f"{accel}@{seq}")


def _sample(node: str, seq: int) -> events.Event:
    return testing.example_events(node, seq=seq)[1]


def _devices(node: str, seq: int) -> events.Event:
    return testing.example_events(node, seq=seq)[0]


def _checked(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


def _count(metrics: BusMetrics, name: str, kind: str) -> float:
    return metrics.registry.get_sample_value(name, {"kind": kind}) or 0.0


async def _health_reasons(conn: connection.Connection, settings: BusSettings) -> list[str]:
    raw = await state.history(conn, settings, node="n1", kind="health")
    return [str(msgspec.json.decode(data)["reason"]) for _, data in raw]


async def _sample_nodes(conn: connection.Connection, settings: BusSettings) -> set[str]:
    return {subjects.parse(s)[0] for s, _ in await state.snapshot(conn, settings, kind="samples")}


async def test_events_published_before_the_server_exists_arrive_once_it_is_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = embedded.free_port()
    settings = BusSettings.for_tests(f"nats://127.0.0.1:{port}", outbox_size=3)
    metrics = BusMetrics()
    async with (
        publishing.publisher(settings=settings, metrics=metrics) as pub,
        anyio.create_task_group() as tg,
    ):
        linked = anyio.CancelScope()

        async def link() -> None:
            with linked:
                await publishing.link(pub, settings)

        tg.start_soon(link)
        for seq in range(5):
            pub.publish(_health("n1", "GPU-0", seq))
            pub.publish(_health("n1", "GPU-1", seq))
            pub.publish(_devices("n1", seq))
            pub.publish(_sample(f"s{seq}", seq))
        # Two health keys and one devices state, coalesced; three samples, two dropped.
        assert pub.pending == 2 + 1 + 3
        assert _count(metrics, "gpustack_bus_outbox_dropped_events_total", "samples") == 2
        await testing.eventually(_checked(lambda: "cannot connect" in caplog.text))
        assert not pub.attached
        async with embedded.embedded_server(tmp_path / "nats", port=port) as server:
            with anyio.fail_after(20):
                await pub.wait_sent()
            assert pub.attached
            async with connection.connect(testing.settings_for(server), retry=False) as reader:
                assert await _health_reasons(reader, settings) == ["GPU-0@4", "GPU-1@4"]
                latest = dict(await state.snapshot(reader, settings, node="n1"))
                devices = msgspec.json.decode(latest[subjects.subject("n1", "devices")])
                assert devices["groups"][0]["memory"] == 143771 + 4

                async def newest_samples_stored() -> bool:
                    return await _sample_nodes(reader, settings) == {"s2", "s3", "s4"}

                await testing.eventually(newest_samples_stored)
            assert _count(metrics, "gpustack_bus_published_events_total", "health") == 2
            # The link ends while the server is still up: a nats-py reconnect loop cancelled in
            # the very turn its connect attempt fails can lose the cancellation
            # (asyncio.wait_for), which the leaked-task check would report.
            linked.cancel()
            await testing.eventually(_checked(lambda: not pub.attached))
        tg.cancel_scope.cancel()


async def test_a_publisher_keeps_its_outbox_between_connections(
    settings: BusSettings, metrics: BusMetrics
) -> None:
    async with publishing.publisher(settings=settings, metrics=metrics) as pub:
        async with connection.connect(settings, retry=False) as first, pub.attach(first):
            pub.publish(_health("n1", "GPU-0", 0))
            await pub.wait_sent()
            with pytest.raises(RuntimeError):
                async with pub.attach(first):
                    pass
        assert not pub.attached
        pub.publish(_health("n1", "GPU-0", 1))
        pub.publish(_health("n1", "GPU-0", 2))
        await anyio.sleep(0.2)
        assert pub.pending == 1  # queued (coalesced), nothing to send it through
        async with connection.connect(settings, retry=False) as second, pub.attach(second):
            with anyio.fail_after(10):
                await pub.wait_sent()
            assert await _health_reasons(second, settings) == ["GPU-0@0", "GPU-0@2"]
    assert pub.closed
    with pytest.raises(PublisherClosed):
        pub.publish(_health("n1", "GPU-0", 3))
    async with connection.connect(settings, retry=False) as third:
        with pytest.raises(PublisherClosed):
            async with pub.attach(third):
                pass


async def test_cancelling_the_link_flushes_what_was_accepted(
    settings: BusSettings, metrics: BusMetrics
) -> None:
    nodes = [f"node-{i}" for i in range(50)]
    async with publishing.publisher(settings=settings, metrics=metrics) as pub:
        async with anyio.create_task_group() as tg:
            tg.start_soon(publishing.link, pub, settings)
            await testing.eventually(_checked(lambda: pub.attached))
            for seq, node in enumerate(nodes):
                pub.publish(_devices(node, seq))
            tg.cancel_scope.cancel()  # at once: the flush on the way out sends them
        assert pub.pending == 0
        assert not pub.attached
    async with connection.connect(settings, retry=False) as reader:
        stored = {subjects.parse(s)[0] for s, _ in await state.snapshot(reader, settings)}
    assert stored == set(nodes)

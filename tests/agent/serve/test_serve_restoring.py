"""The ledger is rebuilt from the bus's retained allocation history after a restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.deviceplugin.holdings import live_allocations
from agent.serve import restoring
from agent.serve.settings import ServeSettings
from bus import connection, events, publishing, state, testing
from bus.metrics import BusMetrics
from bus.settings import BusSettings

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def _event(allocation: str, action: str, seconds: int, node: str = "n1") -> events.AllocationEvent:
    return events.AllocationEvent(
        node=node,
        ts=T0 + timedelta(seconds=seconds),
        allocation_id=allocation,
        action=action,  # type: ignore[arg-type]
        resource="nvidia.com/gpu",
        device_ids=(f"nvidia-h200:GPU-{allocation}:0000",),
    )


def test_the_latest_event_per_allocation_wins() -> None:
    history = [
        _event("a", "allocated", 1),
        _event("b", "allocated", 2),
        _event("a", "released", 3),
        _event("c", "released", 4),
        _event("c", "allocated", 5),
        _event("d", "allocated", 7),
        _event("d", "released", 6),  # arrived late but is older: d is still held
    ]
    assert sorted(e.allocation_id for e in live_allocations(history)) == ["b", "c", "d"]


@pytest.mark.anyio
async def test_retained_history_of_this_node_only(tmp_path: Path) -> None:
    async with testing.nats_server(tmp_path) as server:
        bus = testing.settings_for(server)
        async with connection.connect(bus, retry=False) as conn:
            await state.ensure_streams(conn, bus)
            async with publishing.publisher(conn, settings=bus, metrics=BusMetrics()) as pub:
                for event in (
                    _event("a", "allocated", 1),
                    _event("b", "allocated", 2),
                    _event("a", "released", 3),
                    _event("x", "allocated", 4, node="other"),
                ):
                    pub.publish(event)
                await pub.wait_sent()
        settings = ServeSettings.for_tests(str(tmp_path), bus=bus, node_name="n1")
        live = await restoring.retained_allocations(settings)
    assert [e.allocation_id for e in live] == ["b"]


@pytest.mark.anyio
async def test_no_bus_at_start_means_the_bus_cannot_say_not_a_failure(tmp_path: Path) -> None:
    settings = ServeSettings.for_tests(
        str(tmp_path), bus=BusSettings.for_tests("nats://127.0.0.1:1"), node_name="n1"
    )
    assert await restoring.retained_allocations(settings) is None
    assert await restoring.initial_allocations(settings) == []  # and no ledger kept on the node

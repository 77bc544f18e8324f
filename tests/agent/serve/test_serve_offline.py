"""``dm serve`` without the bus at start: the ledger comes from the copy kept on the node."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import anyio.to_thread
import grpc
import pytest

from agent.devices import nvidia
from agent.devices.simulation.fakenvml import SimulatedNvml
from agent.serve import holdingsfile, restoring
from agent.serve.running import Running, run
from agent.serve.settings import ServeSettings
from agent.testing import FakeKubelet, unary
from bus import events
from bus.settings import BusSettings
from bus.testing import eventually
from proto.deviceplugin import v1beta1 as dp

pytestmark = pytest.mark.anyio

UNREACHABLE = BusSettings.for_tests("nats://127.0.0.1:1")


def _allocation(allocation: str, node: str = "test-node") -> events.AllocationEvent:
    return events.AllocationEvent(
        node=node,
        allocation_id=allocation,
        action="allocated",
        resource="nvidia.com/gpu",
        device_ids=(f"nvidia-h200:GPU-{allocation}:0000",),
    )


def test_the_file_keeps_what_is_in_force_and_refuses_what_is_not_its_own() -> None:
    held = holdingsfile.fold({}, _allocation("a"))
    held = holdingsfile.fold(held, _allocation("b"))
    released = events.AllocationEvent(
        node="test-node", allocation_id="a", action="released", resource="nvidia.com/gpu"
    )
    held = holdingsfile.fold(held, released)
    data = holdingsfile.encode("test-node", held.values())

    assert [e.allocation_id for e in holdingsfile.decode(data, "test-node")] == ["b"]
    with pytest.raises(holdingsfile.Unusable, match="node 'test-node'"):
        holdingsfile.decode(data, "other-node")
    with pytest.raises(holdingsfile.Unusable, match="not a gpustack-device-ledger/v1 file"):
        holdingsfile.decode(data.replace(b"/v1", b"/v9"), "test-node")
    with pytest.raises(holdingsfile.Unusable):
        holdingsfile.decode(b"\x00garbage", "test-node")


async def test_a_corrupt_file_is_logged_and_the_ledger_starts_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServeSettings.for_tests(str(tmp_path), bus=UNREACHABLE)
    settings.ledger_path.parent.mkdir(parents=True)
    settings.ledger_path.write_bytes(b'{"format": "something-else"}')
    assert await restoring.initial_allocations(settings) == []
    assert "ignoring the local ledger" in caplog.text


async def test_the_bus_unreachable_at_start_means_the_kept_ledger(tmp_path: Path) -> None:
    settings = ServeSettings.for_tests(str(tmp_path), bus=UNREACHABLE)
    kept = holdingsfile.LedgerFile(settings.ledger_path, "test-node")
    async with anyio.create_task_group() as tg:
        await tg.start(kept.keep)
        kept.note(_allocation("a"))
        kept.note(_allocation("b", node="other-node"))  # not this node's: not kept
        tg.cancel_scope.cancel()  # the last change is written on the way out

    assert stat.S_IMODE(os.stat(settings.ledger_path).st_mode) == 0o600
    live = await restoring.initial_allocations(settings)
    assert [e.allocation_id for e in live] == ["a"]


async def _allocate(path: Path, ids: list[str]) -> None:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    await anyio.to_thread.run_sync(
        unary, path, "/v1beta1.DevicePlugin/Allocate", request, dp.AllocateResponse.FromString
    )


async def _socket(kubelet: FakeKubelet, resource: str) -> Path:
    found: list[Path] = []

    async def registered() -> bool:
        path = kubelet.endpoint(resource)
        found[:] = [path] if path else []
        return bool(found)

    await eventually(registered)
    return found[0]


def _first_card(running: Running) -> str:
    (backend,) = [b for b in running.backends if isinstance(b, nvidia.NvidiaBackend)]
    library = backend.nvml.library
    assert isinstance(library, SimulatedNvml)
    return library.cards[0].uuid


async def test_a_restart_without_the_bus_keeps_the_allocations(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    settings = ServeSettings.for_tests(str(tmp_path), bus=UNREACHABLE)
    async with anyio.create_task_group() as tg:
        running: Running = await tg.start(run, settings)
        uuid = _first_card(running)
        await _allocate(await _socket(kubelet, "nvidia.com/gpu"), [f"nvidia-h200:{uuid}:0000"])
        tg.cancel_scope.cancel()
    kubelet.restart()  # a fresh kubelet: the agent registers again

    async with anyio.create_task_group() as tg:
        running = await tg.start(run, settings)
        assert _first_card(running) == uuid
        assert running.plugins.ledger().mode_of(uuid) == "exclusive"
        shared = await _socket(kubelet, "nvidia.com/gpu.shared")
        with pytest.raises(grpc.RpcError) as cross:
            await _allocate(shared, [f"nvidia-h200:{uuid}:0004"])
        tg.cancel_scope.cancel()

    assert cross.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "held in exclusive mode" in (cross.value.details() or "")

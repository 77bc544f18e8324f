"""``dm serve`` registers the driver controls of the manufacturers it serves.

A simulated Ascend node served whole: a shared grant over kubelet's socket turns the container-share
flag on in the same simulated DCMI that detection reads, which only happens when ``run`` handed
the plugins the control made from the Ascend backend.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from agent.devices import ascend
from agent.devices.settings import DetectSettings
from agent.devices.simulation.fakedcmi import SimulatedDcmi
from agent.devices.vendor import VendorBackend
from agent.serve.running import Running, run
from agent.serve.settings import ServeSettings
from agent.testing import FakeKubelet, unary
from bus.settings import BusSettings
from bus.testing import eventually
from proto.deviceplugin import v1beta1 as dp

pytestmark = pytest.mark.anyio

UNREACHABLE = BusSettings.for_tests("nats://127.0.0.1:1")


def _library(running: Running) -> SimulatedDcmi:
    (backend,) = running.backends
    assert isinstance(backend, VendorBackend)
    reader = backend.reader()
    assert isinstance(reader, ascend.AscendReader)
    library = reader.dcmi.library
    assert isinstance(library, SimulatedDcmi)
    return library


async def test_a_served_ascend_node_performs_the_share_step(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    detect = DetectSettings(manufacturers=("ascend",), fast_failed=False, simulate="ascend-910b2x8")
    settings = ServeSettings.for_tests(str(tmp_path), bus=UNREACHABLE, detect=detect)
    async with anyio.create_task_group() as tg:
        running: Running = await tg.start(run, settings)
        socket: list[Path] = []

        async def registered() -> bool:
            path = kubelet.endpoint("huawei.com/npu.shared")
            socket[:] = [path] if path else []
            return bool(socket) and bool(running.observer.published)

        await eventually(registered)
        (group,) = running.observer.published
        card = group.accelerators[3]
        ids = [f"{group.id}:{card.id}:0002"]
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
        )
        reply = await anyio.to_thread.run_sync(
            unary, socket[0], "/v1beta1.DevicePlugin/Allocate", request,
            dp.AllocateResponse.FromString,
        )  # fmt: skip
        shared = _library(running).shared
        tg.cancel_scope.cancel()

    assert card.physical_indexes is not None
    physical = card.physical_indexes[0]
    (container,) = reply.container_responses
    assert dict(container.envs) == {"ASCEND_VISIBLE_DEVICES": str(physical)}
    assert shared == [i == 3 for i in range(8)]

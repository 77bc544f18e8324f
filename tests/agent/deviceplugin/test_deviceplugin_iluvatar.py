"""Iluvatar over kubelet's API (grpcio against our servers): each mode checked field by field."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from vendor_groups import group, mounts, nodes, session, sidecar_pod, token

from agent.deviceplugin import slicing
from agent.testing import FakeKubelet

pytestmark = pytest.mark.anyio

BI_V150 = group("iluvatar", "iluvatar-bi-v150", cards=4, memory=32768)


async def test_every_mode_answers_with_the_env_the_runtime_reads(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    pod = sidecar_pod("iluvatar", "shared", 1)  # the owner's share of card #1
    async with session(tmp_path, kubelet, [BI_V150], pending=pod) as s:
        whole = await s.allocate("iluvatar", "exclusive", [token(BI_V150, 2), token(BI_V150, 0)])
        shared = await s.allocate("iluvatar", "shared", [token(BI_V150, 1, 4)])
        seen = await s.allocate("iluvatar", "visibility", [token(BI_V150, 3, 7)])  # a card #3 token

    # ix-container-runtime makes /dev/iluvatar<minor> and mounts corex: the env is all.
    assert whole.envs == {"IX_VISIBLE_DEVICES": "0,2"}
    assert shared.envs == seen.envs == {"IX_VISIBLE_DEVICES": "1"}
    for response in (whole, shared, seen):
        assert (response.mounts, response.devices, response.annotations) == ([], [], {})


async def test_sliced_adds_hami_core_from_the_flat_iluvatar_directory(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    ids = [token(BI_V150, 3, i) for i in range(4)]  # 4 of 16 slices: a quarter of the card
    async with session(tmp_path, kubelet, [BI_V150]) as s:
        sliced = await s.allocate("iluvatar", "sliced", ids)
        held = s.plugins.ledger().used(BI_V150.accelerators[3].id)

    lib = "/var/lib/gpustack/operator/lib/iluvatar"
    work = slicing.work_dir(str(tmp_path / "pods"), f"iluvatar.com/gpu.sliced/{min(ids)}")
    assert sliced.envs == {
        "IX_VISIBLE_DEVICES": "3",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "8192m",
        "CUDA_DEVICE_SM_LIMIT": "25",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/cudevshr.cache",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "LIBCUDA_LOG_LEVEL": "0",
    }
    assert mounts(sliced) == {
        "/etc/ld.so.preload": (f"{lib}/ld.so.preload", True),
        "/usr/local/vgpu/libvgpu.so": (f"{lib}/libvgpu.so", True),
        "/tmp/vgpulock": ("/tmp/vgpulock", False),
        "/tmp/vgpu": (f"{work}/tmp/vgpu", False),
        "/dev/shm": ("/dev/shm", False),
    }
    assert nodes(sliced) == []
    assert await anyio.Path(work, "tmp/vgpu").is_dir()  # made before the reply
    assert held == 400_000

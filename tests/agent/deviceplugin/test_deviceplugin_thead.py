"""T-Head PPU over kubelet's API (grpcio against our servers): each mode field by field."""

from __future__ import annotations

from pathlib import Path

import anyio
import grpc
import pytest
from vendor_groups import group, mounts, nodes, session, sidecar_pod, token

from agent.deviceplugin import slicing
from agent.testing import FakeKubelet

pytestmark = pytest.mark.anyio

ZW810E = group("thead", "thead-ppu-zw810e", cards=3, memory=97920)
CONTROLS = [("/dev/alixpu", "/dev/alixpu", "rw"), ("/dev/alixpu_ctl", "/dev/alixpu_ctl", "rw")]


def ppu(n: int) -> tuple[str, str, str]:
    return (f"/dev/alixpu_ppu{n}", f"/dev/alixpu_ppu{n}", "rw")


async def test_every_mode_passes_the_card_and_control_nodes_and_no_env(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    pod = sidecar_pod("thead", "shared", 1)  # the owner's share of card #1
    async with session(tmp_path, kubelet, [ZW810E], pending=pod) as s:
        whole = await s.allocate("thead", "exclusive", [token(ZW810E, 2), token(ZW810E, 0)])
        shared = await s.allocate("thead", "shared", [token(ZW810E, 1, 5)])
        seen = await s.allocate("thead", "visibility", [token(ZW810E, 2, 11)])  # a card #2 token

    assert nodes(whole) == [*CONTROLS, ppu(0), ppu(2)]
    assert nodes(shared) == nodes(seen) == [*CONTROLS, ppu(1)]
    for response in (whole, shared, seen):
        assert (response.envs, response.mounts, response.annotations) == ({}, [], {})


async def test_sliced_adds_the_hggc_pair_quotas_and_a_ledger_directory(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    ids = [token(ZW810E, 0, i) for i in range(16)] + [token(ZW810E, 1, i) for i in range(8)]
    async with session(tmp_path, kubelet, [ZW810E]) as s:
        sliced = await s.allocate("thead", "sliced", ids)

    lib = "/var/lib/gpustack/operator/lib/thead"
    work = slicing.work_dir(str(tmp_path / "pods"), f"alibabacloud.com/ppu.sliced/{min(ids)}")
    assert sliced.envs == {
        "HGGC_DEVICE_SM_LIMIT": "50",  # the smaller share of the two cards (8 of 16)
        "HGGC_DEVICE_MEMORY_LIMIT_0": "97920m",  # all 16 slices of card 0
        "HGGC_DEVICE_MEMORY_LIMIT_1": "48960m",
        "HGGC_LEDGER_PATH": "/tmp/hggc",
        "LIBHGGC_LOG_LEVEL": "1",
    }
    assert mounts(sliced) == {
        "/etc/ld.so.preload": (f"{lib}/ld.so.preload", True),
        "/usr/local/vppu/hggc_quota.so": (f"{lib}/hggc_quota.so", True),
        "/usr/local/vppu/hgml_dlsym_hook.so": (f"{lib}/hgml_dlsym_hook.so", True),
        "/usr/local/vppu/ppu-monitor": (f"{lib}/ppu-monitor", True),
        "/tmp/hggc": (f"{work}/tmp/hggc", False),
    }
    assert nodes(sliced) == [*CONTROLS, ppu(0), ppu(1)]
    assert await anyio.Path(work, "tmp/hggc").is_dir()


async def test_the_sm_limit_is_set_even_for_a_whole_card(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    async with session(tmp_path, kubelet, [ZW810E]) as s:
        sliced = await s.allocate("thead", "sliced", [token(ZW810E, 2, i) for i in range(16)])

    assert sliced.envs["HGGC_DEVICE_SM_LIMIT"] == "100"


async def test_partition_tokens_are_served_and_refused_without_mig_control(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    mig = group("thead", "thead-ppu-zw810e", cards=1, memory=97920, partitions=7)
    async with session(tmp_path, kubelet, [mig]) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("thead", "partitioned", [token(mig, 0, 3)])
        published = len(s.published)

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "thead partition instances are not created" in (refused.value.details() or "")
    assert published == 0

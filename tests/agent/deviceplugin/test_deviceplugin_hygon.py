"""Hygon DCU over kubelet's API (grpcio against our servers): each mode field by field."""

from __future__ import annotations

from pathlib import Path

import anyio
import grpc
import pytest
from vendor_groups import group, mounts, nodes, session, sidecar_pod, token

from agent.deviceplugin import errors, slicing
from agent.deviceplugin.resources import cards_of
from agent.deviceplugin.vendors import hygon
from agent.testing import FakeKubelet

pytestmark = pytest.mark.anyio

K100 = group(
    "hygon", "hygon-k100-ai", cards=3, memory=65520, cores=120, physical=lambda i: (i + 1, 128 + i)
)
KFD = [("/dev/kfd", "/dev/kfd", "rw"), ("/dev/mkfd", "/dev/mkfd", "rwm")]


def dri(n: int) -> list[tuple[str, str, str]]:
    card, render = f"/dev/dri/card{n + 1}", f"/dev/dri/renderD{128 + n}"
    return [(card, card, "rw"), (render, render, "rw")]


async def test_every_mode_passes_kfd_mkfd_the_dri_nodes_and_hyhal(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    pod = sidecar_pod("hygon", "shared", 1)  # the owner's share of card #1
    async with session(tmp_path, kubelet, [K100], pending=pod) as s:
        whole = await s.allocate("hygon", "exclusive", [token(K100, 2), token(K100, 0)])
        shared = await s.allocate("hygon", "shared", [token(K100, 1, 0)])
        seen = await s.allocate("hygon", "visibility", [token(K100, 2, 100)])  # a card #2 token

    assert nodes(whole) == [*KFD, *dri(0), *dri(2)]
    assert nodes(shared) == nodes(seen) == [*KFD, *dri(1)]
    for response in (whole, shared, seen):
        assert mounts(response) == {"/opt/hyhal": ("/opt/hyhal", True)}
        assert (response.envs, response.annotations) == ({}, {})


async def test_sliced_writes_vdev0_conf_and_mounts_its_directory(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    ids = [token(K100, 1, 2)]  # 1 of 4 slices, the third: CUs 60-89 of 120
    async with session(tmp_path, kubelet, [K100]) as s:
        sliced = await s.allocate("hygon", "sliced", ids)
        with pytest.raises(grpc.RpcError) as two_cards:
            await s.allocate("hygon", "sliced", [token(K100, 0, 0), token(K100, 2, 0)])

    work = slicing.work_dir(str(tmp_path / "pods"), f"hygon.com/dcu.sliced/{ids[0]}")
    vdev = f"{work}/etc/vdev/docker"
    assert mounts(sliced) == {
        "/opt/hyhal": ("/opt/hyhal", True),
        "/etc/vdev/docker": (vdev, True),
    }
    assert nodes(sliced) == [*KFD, *dri(1)]
    assert sliced.envs == {}
    mask = ((1 << 30) - 1) << 60
    assert await anyio.Path(vdev, "vdev0.conf").read_text() == (
        "PciBusId: 0000:02:00.0\n"
        f"cu_mask: 0x{mask & (2**64 - 1):016x}\n"
        f"cu_mask: 0x{mask >> 64:016x}\n"
        "cu_count: 30\n"
        "mem: 16380 MiB\n"
        "device_id: 0\n"
        "vdev_id: 2\n"
        "pipe_id: 2\n"
        "enable: 1\n"
    )
    assert two_cards.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_cu_run_stays_on_the_card_and_refuses_below_one_unit() -> None:
    card = cards_of([K100])[K100.accelerators[0].id]
    moved = ((1 << 60) - 1) << 60  # 3/4 of the card would start at CU 90: moved down to fit
    assert hygon.cu_mask(card, (3,), 50) == (60, moved & (2**64 - 1), moved >> 64)
    assert hygon.cu_mask(card, (0,), 100) == (120, 2**64 - 1, (1 << 56) - 1)
    with pytest.raises(errors.CannotInject, match="ask for at least 1 %"):
        hygon.cu_mask(card, (0,), 0)

"""Cambricon over kubelet's API (grpcio against our servers): each mode field by field."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from vendor_groups import group, nodes, session, sidecar_pod, token

from agent.deviceplugin import responders
from agent.deviceplugin.allocation import Grant
from agent.deviceplugin.injection import DriverStep
from agent.deviceplugin.resources import cards_of
from agent.testing import FakeKubelet

pytestmark = pytest.mark.anyio

MLU370 = group("cambricon", "cambricon-mlu370-x8", cards=3, memory=49152, physical=lambda i: (i,))
CTL = ("/dev/cambricon_ctl", "/dev/cambricon_ctl", "rw")


def dev(n: int) -> tuple[str, str, str]:
    return (f"/dev/cambricon_dev{n}", f"/dev/cambricon_dev{n}", "rw")


async def test_every_mode_passes_the_card_nodes_and_names_the_slots(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    pod = sidecar_pod("cambricon", "exclusive", 2)  # the owner's cards #2 and #0
    async with session(tmp_path, kubelet, [MLU370], pending=pod) as s:
        whole = await s.allocate("cambricon", "exclusive", [token(MLU370, 2), token(MLU370, 0)])
        shared = await s.allocate("cambricon", "shared", [token(MLU370, 1, 1)])
        # kubelet's visibility tokens are interchangeable: these sit on card #1
        seen = await s.allocate(
            "cambricon", "visibility", [token(MLU370, 1, 44), token(MLU370, 1, 45)]
        )

    assert whole.envs == seen.envs == {"CAMBRICON_VISIBLE_DEVICES": "0,2"}
    assert shared.envs == {"CAMBRICON_VISIBLE_DEVICES": "1"}
    assert nodes(whole) == nodes(seen) == [CTL, dev(0), dev(2)]
    assert nodes(shared) == [CTL, dev(1)]
    for response in (whole, shared, seen):
        assert (response.mounts, response.annotations) == ([], {})


async def test_sliced_asks_for_an_smlu_instance(tmp_path: Path, kubelet: FakeKubelet) -> None:
    ids = [token(MLU370, 1, i) for i in range(8)]  # 8 of 16 slices
    made: list[DriverStep] = []
    async with session(tmp_path, kubelet, [MLU370], controls={"cambricon-smlu": made.append}) as s:
        sliced = await s.allocate("cambricon", "sliced", ids)

    assert sliced.envs == {"CAMBRICON_VISIBLE_DEVICES": "1"}
    assert nodes(sliced) == [CTL, dev(1)]
    assert made == [
        DriverStep(
            "cambricon-smlu",
            MLU370.accelerators[1].id,
            (("slot", "1"), ("mlu-quota", "50"), ("memory-mib", "24576")),
        )
    ]


async def test_without_an_smlu_control_sliced_is_refused(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    async with session(tmp_path, kubelet, [MLU370]) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("cambricon", "sliced", [token(MLU370, 1, 0)])
        published = len(s.published)

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cambricon-smlu on CAMBRICON-01" in (refused.value.details() or "")
    assert published == 0


def test_per_card_nodes_follow_the_slot_where_the_host_has_them() -> None:
    card = cards_of([MLU370])[MLU370.accelerators[1].id]
    grant = Grant(mode="exclusive", cards=((card, (0,)),), holding=None)
    present = {"/dev/cambricon_ipcm1", "/dev/cambr-msgq:1", "/dev/cambricon_gdr", "/dev/commu0"}
    injection = responders.respond(
        grant, host_lib_dir="/lib", host_work_dir="/work", exists=present.__contains__
    )
    assert [d.host_path for d in injection.devices] == [
        "/dev/cambricon_ctl",
        "/dev/cambricon_gdr",
        "/dev/cambricon_dev1",
        "/dev/cambricon_ipcm1",
        "/dev/cambr-msgq:1",
    ]

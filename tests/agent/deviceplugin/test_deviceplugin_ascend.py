"""Ascend over kubelet's API (grpcio against our servers): each mode checked field by field."""

from __future__ import annotations

from pathlib import Path

import anyio
import grpc
import pytest
from vendor_groups import group, mounts, nodes, session, sidecar_pod, token

from agent.deviceplugin import errors, slicing
from agent.deviceplugin.injection import DriverStep
from agent.testing import FakeKubelet

pytestmark = pytest.mark.anyio

# Physical ids differ from the logic ids (indexes) on purpose: the runtime wants physical ones.
A910B = group(
    "ascend",
    "ascend-910b2",
    cards=4,
    memory=65536,
    cores=24,
    family="910b",
    runtime_version="8.2",
    physical=lambda i: (7 - i,),
)


class Share:
    """A container-share control that records what it was asked."""

    def __init__(self) -> None:
        self.steps: list[DriverStep] = []

    def __call__(self, step: DriverStep) -> None:
        self.steps.append(step)


async def test_exclusive_names_physical_ids_and_leaves_the_share_flag_alone(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    share = Share()
    async with session(tmp_path, kubelet, [A910B], controls={"ascend-container-share": share}) as s:
        whole = await s.allocate("ascend", "exclusive", [token(A910B, 0), token(A910B, 3)])

    # The Ascend Docker Runtime makes /dev/davinci<N> and mounts the driver from the env alone.
    assert whole.envs == {"ASCEND_VISIBLE_DEVICES": "7,4"}
    assert (whole.mounts, whole.devices, whole.annotations) == ([], [], {})
    assert share.steps == []


async def test_shared_and_visibility_turn_container_share_on_first(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    share = Share()
    pod = sidecar_pod("ascend", "shared", 1)  # the owner's share of card #1 (physical id 6)
    controls = {"ascend-container-share": share}
    async with session(tmp_path, kubelet, [A910B], pending=pod, controls=controls) as s:
        shared = await s.allocate("ascend", "shared", [token(A910B, 1, 3)])
        seen = await s.allocate("ascend", "visibility", [token(A910B, 3, 9)])  # a card #3 token

    # The sidecar is a second tenant of the owner's card: the flag goes on for that card.
    assert shared.envs == seen.envs == {"ASCEND_VISIBLE_DEVICES": "6"}
    assert shared.mounts == seen.mounts == [] and shared.devices == seen.devices == []
    card = A910B.accelerators[1].id
    step = DriverStep("ascend-container-share", card, (("physical-id", "6"),))
    assert share.steps == [step, step]


async def test_a_sidecar_of_a_sliced_owner_sees_its_card_without_vcann_rt(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    share = Share()
    pod = sidecar_pod("ascend", "sliced", 1, units=400_000, memory_percentage=25,
                      cores_percentage=25)  # fmt: skip
    controls = {"ascend-container-share": share}
    async with session(tmp_path, kubelet, [A910B], pending=pod, controls=controls) as s:
        sliced = await s.allocate("ascend", "sliced", [token(A910B, 2, 5)])
        work = sorted(p.name for p in (tmp_path / "pods").iterdir())
        seen = await s.allocate("ascend", "visibility", [token(A910B, 0, 9)])
        after = sorted(p.name for p in (tmp_path / "pods").iterdir())
        holdings = s.plugins.ledger().holdings()

    assert sliced.envs["ASCEND_VISIBLE_DEVICES"] == "5"
    assert "/etc/enpu/vcann-rt/npu_info.config" in mounts(sliced)
    # The plain response (§3.7): the owner's card by physical id, no quota of its own, no
    # config written for it; the share flag is still asked for, on the owner's card.
    assert seen.envs == {"ASCEND_VISIBLE_DEVICES": "5"}
    assert (seen.mounts, seen.devices, seen.annotations) == ([], [], {})
    assert after == work and len(work) == 1  # the owner's work directory only
    step = DriverStep("ascend-container-share", A910B.accelerators[2].id, (("physical-id", "5"),))
    assert share.steps == [step, step]
    assert [(h.container, h.mode) for h in holdings] == [("main", "sliced")]


async def test_without_a_share_control_the_grant_is_refused_and_nothing_charged(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    async with session(tmp_path, kubelet, [A910B]) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("ascend", "shared", [token(A910B, 1, 3)])
        whole = await s.allocate("ascend", "exclusive", [token(A910B, 1)])  # needs no step
        published = len(s.published)

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ascend-container-share on ASCEND-01 (physical-id=6)" in (refused.value.details() or "")
    assert whole.envs == {"ASCEND_VISIBLE_DEVICES": "6"}
    assert published == 1  # only the exclusive grant


async def test_sliced_mounts_vcann_rt_and_writes_its_config(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    ids = [token(A910B, 2, i) for i in range(21, 42)]  # 21 of 63 slices: a third of the card
    share = Share()
    async with session(tmp_path, kubelet, [A910B], controls={"ascend-container-share": share}) as s:
        sliced = await s.allocate("ascend", "sliced", ids)
        with pytest.raises(grpc.RpcError) as two_cards:
            await s.allocate("ascend", "sliced", [token(A910B, 0, 0), token(A910B, 3, 0)])

    lib = "/var/lib/gpustack/operator/lib/ascend/cann-8-910b"
    work = slicing.work_dir(str(tmp_path / "pods"), f"huawei.com/npu.sliced/{min(ids)}")
    assert sliced.envs == {
        "ASCEND_VISIBLE_DEVICES": "5",
        "ENPU_LOG_LEVEL": "1",
        "ENPU_DSMI_HOOK": "1",
    }
    assert mounts(sliced) == {
        "/etc/ld.so.preload": (f"{lib}/ld.so.preload", True),
        "/opt/enpu/vcann-rt/lib/libvruntime.so": (f"{lib}/libvruntime.so", True),
        "/opt/enpu/vcann-rt/tools/enpu-monitor": (f"{lib}/enpu-monitor", True),
        "/etc/enpu/vcann-rt/npu_info.config": (f"{work}/npu_info.config", True),
        "/dev/shm": ("/dev/shm", False),
    }
    assert nodes(sliced) == []
    config = await anyio.Path(work, "npu_info.config").read_text()
    assert config == (
        "physical-npu-id=5\nvnpu-id=21\naicore-quota=33\nmemory-quota=21845\n"
    )  # 21/63 of 65536 MiB, rounded down
    assert [s.card for s in share.steps] == [A910B.accelerators[2].id]
    assert two_cards.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "vcann-rt slices one card per container" in (two_cards.value.details() or "")


async def test_a_sliced_grant_refused_for_its_step_leaves_no_config_behind(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    def refuse(step: DriverStep) -> None:
        raise errors.ActuationFailed(f"{step.describe()}: dcmi error -8002 (not permitted)")

    ids = [token(A910B, 2, i) for i in range(21)]
    controls = {"ascend-container-share": refuse}
    async with session(tmp_path, kubelet, [A910B], controls=controls) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("ascend", "sliced", ids)
        left = sorted((tmp_path / "pods").rglob("*"))
        holdings = s.plugins.ledger().holdings()

    assert refused.value.code() == grpc.StatusCode.INTERNAL
    assert left == []  # the npu_info.config written before the step is gone with its directory
    assert holdings == ()


async def test_a_card_without_a_physical_id_is_refused_not_guessed(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    bare = group("ascend", "ascend-910b2", cards=1, family="910b")
    async with session(tmp_path, kubelet, [bare]) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("ascend", "exclusive", [token(bare, 0)])

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "reports no physical id" in (refused.value.details() or "")


async def test_a_driver_that_refuses_the_step_fails_the_grant_and_charges_nothing(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    def refuse(step: DriverStep) -> None:
        raise errors.ActuationFailed(f"{step.describe()}: dcmi error -8002 (not permitted)")

    pod = sidecar_pod("ascend", "exclusive", 1)
    controls = {"ascend-container-share": refuse}
    async with session(tmp_path, kubelet, [A910B], pending=pod, controls=controls) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("ascend", "shared", [token(A910B, 1, 3)])
        before = s.plugins.ledger().holdings()
        await s.allocate("ascend", "exclusive", [token(A910B, 0)])  # the owner: no step
        with pytest.raises(grpc.RpcError) as unseen:
            await s.allocate("ascend", "visibility", [token(A910B, 2, 1)])
        holdings = s.plugins.ledger().holdings()

    for error in (refused.value, unseen.value):
        assert error.code() == grpc.StatusCode.INTERNAL
        assert "not permitted" in (error.details() or "")
    assert "ASCEND-00" in (unseen.value.details() or "")  # the owner's card, not kubelet's pick
    assert before == ()
    assert [(h.container, h.mode) for h in holdings] == [("main", "exclusive")]

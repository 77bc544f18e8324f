"""Moore Threads over kubelet's API (grpcio against our servers): each mode field by field."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from vendor_groups import group, session, sidecar_pod, token

from agent.testing import FakeKubelet

pytestmark = pytest.mark.anyio

S4000 = group("mthreads", "mthreads-mtt-s4000", cards=3, memory=49152)


async def test_every_mode_answers_with_the_toolkit_env_alone(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    pod = sidecar_pod("mthreads", "exclusive", 2)  # the owner's cards #1 and #0
    async with session(tmp_path, kubelet, [S4000], pending=pod) as s:
        whole = await s.allocate("mthreads", "exclusive", [token(S4000, 1), token(S4000, 0)])
        shared = await s.allocate("mthreads", "shared", [token(S4000, 2, 2)])
        seen = await s.allocate(
            "mthreads", "visibility", [token(S4000, 2, 300), token(S4000, 0, 7)]
        )

    # The MT container toolkit injects the driver and /dev/mtgpu.* from the env.
    assert whole.envs == seen.envs == {"MTHREADS_VISIBLE_DEVICES": "0,1"}
    assert shared.envs == {"MTHREADS_VISIBLE_DEVICES": "2"}
    for response in (whole, shared, seen):
        assert (response.mounts, response.devices, response.annotations) == ([], [], {})


async def test_sliced_sets_a_byte_cap_and_a_compute_weight(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    ids = [token(S4000, 1, i) for i in range(4)]  # 4 of 16 slices
    async with session(tmp_path, kubelet, [S4000]) as s:
        sliced = await s.allocate("mthreads", "sliced", ids)
        with pytest.raises(grpc.RpcError) as two_cards:
            await s.allocate("mthreads", "sliced", [token(S4000, 0, 0), token(S4000, 1, 9)])

    assert sliced.envs == {
        "MTHREADS_VISIBLE_DEVICES": "1",
        "MTHREADS_QOS_MEMORY_LIMIT": str(12288 << 20),  # a quarter of 48 GiB, in bytes
        "MTHREADS_QOS_COMPUTING_POWER_WEIGHT": "25",
    }
    assert (sliced.mounts, sliced.devices) == ([], [])
    assert two_cards.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the sGPU module slices one card per container" in (two_cards.value.details() or "")

"""MetaX over kubelet's API (grpcio against our servers): each mode field by field."""

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

C500 = group("metax", "metax-mxc500", cards=3, memory=65536, physical=lambda i: (i + 1, 128 + i))


def dri(n: int) -> list[tuple[str, str, str]]:
    card, render = f"/dev/dri/card{n + 1}", f"/dev/dri/renderD{128 + n}"
    return [(card, card, "rw"), (render, render, "rw")]


MXCD = ("/dev/mxcd", "/dev/mxcd", "rw")


async def test_every_mode_passes_the_control_and_dri_nodes_and_no_env(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    pod = sidecar_pod("metax", "exclusive", 2)  # the owner's cards #0 and #2
    async with session(tmp_path, kubelet, [C500], pending=pod) as s:
        whole = await s.allocate("metax", "exclusive", [token(C500, 0), token(C500, 2)])
        shared = await s.allocate("metax", "shared", [token(C500, 1, 9)])
        seen = await s.allocate("metax", "visibility", [token(C500, 1, 0), token(C500, 1, 1)])

    assert nodes(whole) == nodes(seen) == [MXCD, *dri(0), *dri(2)]
    assert nodes(shared) == [MXCD, *dri(1)]
    for response in (whole, shared, seen):
        assert (response.envs, response.mounts, response.annotations) == ({}, [], {})


async def test_sliced_asks_for_an_sgpu_and_names_it(tmp_path: Path, kubelet: FakeKubelet) -> None:
    ids = [token(C500, 2, i) for i in (5, 6, 7, 8)]  # 4 of 16 slices
    made: list[DriverStep] = []
    async with session(tmp_path, kubelet, [C500], controls={"metax-sgpu": made.append}) as s:
        sliced = await s.allocate("metax", "sliced", ids)
        with pytest.raises(grpc.RpcError) as two_cards:
            await s.allocate("metax", "sliced", [token(C500, 0, 0), token(C500, 1, 0)])

    assert nodes(sliced) == [MXCD, *dri(2)]
    assert sliced.envs == {
        "METAX_SGPUS": "sgpu=0000:03:00.0#5;compute=25;vram=16384;alias=metax-mxc500-0005"
    }
    assert made == [
        DriverStep(
            "metax-sgpu",
            C500.accelerators[2].id,
            (
                ("bdf", "0000:03:00.0"),
                ("index", "5"),
                ("policy", "fixed-share"),
                ("compute", "25"),
                ("vram-mib", "16384"),
            ),
        )
    ]
    assert two_cards.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_without_an_sgpu_control_sliced_is_refused(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    async with session(tmp_path, kubelet, [C500]) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("metax", "sliced", [token(C500, 0, 0)])

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no driver control for" in (refused.value.details() or "")


def test_optional_control_nodes_are_passed_only_where_the_host_has_them() -> None:
    card = cards_of([C500])[C500.accelerators[0].id]
    grant = Grant(mode="exclusive", cards=((card, (0,)),), holding=None)
    present = {"/dev/mxgd"}
    injection = responders.respond(
        grant, host_lib_dir="/lib", host_work_dir="/work", exists=present.__contains__
    )
    assert [d.host_path for d in injection.devices] == [
        "/dev/mxcd",
        "/dev/mxgd",
        "/dev/dri/card1",
        "/dev/dri/renderD128",
    ]

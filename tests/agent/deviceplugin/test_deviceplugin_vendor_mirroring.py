"""An SSH sidecar of a sliced owner, for each of the seven (grpcio against our servers).

Reference §3.7: the sidecar gets the plain response of its owner's cards (the env, and the device
nodes for the vendors that pass them), never the owner's slicing runtime: no caps, no preload, no
work directory or config file of its own, and no driver step beyond Ascend's container-share flag
(§3.6: a second tenant of the card). The owner's own sliced grant is what asked for its sMLU
instance or sGPU; the sidecar asks for nothing more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vendor_groups import group, mounts, nodes, session, sidecar_pod, token

from agent.deviceplugin.injection import DriverStep
from agent.testing import FakeKubelet
from bus import devices

pytestmark = pytest.mark.anyio


def _dri(n: int) -> list[tuple[str, str, str]]:
    card, render = f"/dev/dri/card{n + 1}", f"/dev/dri/renderD{128 + n}"
    return [(card, card, "rw"), (render, render, "rw")]


def _node(path: str, permissions: str = "rw") -> tuple[str, str, str]:
    return (path, path, permissions)


_TWO = {"physical": lambda i: (i + 1, 128 + i)}  # /dev/dri/card<i+1>, renderD<128+i>
GROUPS: dict[str, devices.DeviceGroup] = {
    "ascend": group("ascend", "ascend-910b2", memory=65536, cores=24, family="910b",
                    runtime_version="8.2", physical=lambda i: (7 - i,)),
    "cambricon": group("cambricon", "cambricon-mlu370-x8", memory=49152, physical=lambda i: (i,)),
    "hygon": group("hygon", "hygon-k100-ai", memory=65520, cores=120, **_TWO),
    "iluvatar": group("iluvatar", "iluvatar-bi-v150", memory=32768),
    "metax": group("metax", "metax-mxc500", memory=65536, **_TWO),
    "mthreads": group("mthreads", "mthreads-mtt-s4000", memory=49152),
    "thead": group("thead", "thead-ppu-zw810e", memory=97920),
}  # fmt: skip
"""Two cards each; the owner holds a slice of card #1, kubelet's sidecar token is on card #0."""

PLAIN: dict[str, tuple[dict[str, str], list[tuple[str, str, str]], dict[str, tuple[str, bool]]]] = {
    "ascend": ({"ASCEND_VISIBLE_DEVICES": "6"}, [], {}),
    "cambricon": (
        {"CAMBRICON_VISIBLE_DEVICES": "1"},
        [_node("/dev/cambricon_ctl"), _node("/dev/cambricon_dev1")],
        {},
    ),
    "hygon": (
        {},
        [_node("/dev/kfd"), _node("/dev/mkfd", "rwm"), *_dri(1)],
        {"/opt/hyhal": ("/opt/hyhal", True)},
    ),
    "iluvatar": ({"IX_VISIBLE_DEVICES": "1"}, [], {}),
    "metax": ({}, [_node("/dev/mxcd"), *_dri(1)], {}),
    "mthreads": ({"MTHREADS_VISIBLE_DEVICES": "1"}, [], {}),
    "thead": ({}, [_node("/dev/alixpu"), _node("/dev/alixpu_ctl"), _node("/dev/alixpu_ppu1")], {}),
}
"""What the sidecar sees, field by field: (envs, device nodes, mounts) of card #1, plain."""

STEPS = {"ascend": "ascend-container-share", "cambricon": "cambricon-smlu", "metax": "metax-sgpu"}


@pytest.mark.parametrize("manufacturer", sorted(GROUPS))
async def test_a_sidecar_of_a_sliced_owner_gets_the_plain_response_of_its_card(
    tmp_path: Path, kubelet: FakeKubelet, manufacturer: str
) -> None:
    g = GROUPS[manufacturer]
    steps: list[DriverStep] = []
    controls = dict.fromkeys(STEPS.values(), steps.append)
    pod = sidecar_pod(manufacturer, "sliced", 1, units=400_000, memory_percentage=25,
                      cores_percentage=50)  # fmt: skip
    async with session(tmp_path, kubelet, [g], pending=pod, controls=controls) as s:
        await s.allocate(manufacturer, "sliced", [token(g, 1, 1)])  # the owner
        owner_steps, work = list(steps), _listing(tmp_path / "pods")
        seen = await s.allocate(manufacturer, "visibility", [token(g, 0, 3)])
        again = await s.allocate(manufacturer, "visibility", [token(g, 0, 3)])  # kubelet retrying
        after = _listing(tmp_path / "pods")
        holdings = s.plugins.ledger().holdings()

    envs, device_nodes, mounted = PLAIN[manufacturer]
    assert (seen.envs, nodes(seen), mounts(seen), seen.annotations) == (envs, device_nodes,
                                                                         mounted, {})  # fmt: skip
    assert again == seen
    assert after == work  # nothing written for the sidecar
    sidecar_steps = steps[len(owner_steps) :]
    if manufacturer == "ascend":  # a second tenant of the owner's card: the share flag, there
        share = DriverStep("ascend-container-share", g.accelerators[1].id, (("physical-id", "6"),))
        assert sidecar_steps == [share, share]
    else:
        assert sidecar_steps == []
    assert [s.card for s in owner_steps] == ([g.accelerators[1].id] if manufacturer in STEPS
                                              else [])  # fmt: skip
    assert [(h.container, h.mode) for h in holdings] == [("main", "sliced")]


def _listing(path: Path) -> list[str]:
    """Every path under ``path``, relative to it (the work directories and their files)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []

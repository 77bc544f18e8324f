"""Driver controls end to end: ``dm serve``'s backends, their controls, Allocate over grpcio.

The backends are the ones a ``--simulate`` run opens, so detection reads the simulated DCMI and
the control registered for ``ascend-container-share`` changes that same simulated driver: the
flag a grant needs is checked on the chip itself, not on a recording stand-in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from vendor_groups import session, sidecar_pod, token

from agent.deviceplugin import errors
from agent.deviceplugin.controls import driver_controls
from agent.deviceplugin.injection import DriverStep
from agent.devices import ascend, detection, sources
from agent.devices.settings import DetectSettings
from agent.devices.simulation.fakedcmi import SimulatedDcmi
from agent.devices.vendor import VendorBackend
from agent.testing import FakeKubelet

pytestmark = pytest.mark.anyio

SET = "dcmi_set_device_share_enable"


class Ascend:
    """The simulated 910B node as ``dm serve --simulate`` sees it."""

    def __init__(self, backends: list[detection.Backend]) -> None:
        self.backends = backends
        (self.group,) = detection.detect(backends).items
        (backend,) = backends
        assert isinstance(backend, VendorBackend)
        reader = backend.reader()
        assert isinstance(reader, ascend.AscendReader)
        self.dcmi = reader.dcmi
        assert isinstance(self.dcmi.library, SimulatedDcmi)
        self.library: SimulatedDcmi = self.dcmi.library

    def physical(self, card: int) -> int:
        indexes = self.group.accelerators[card].physical_indexes
        assert indexes is not None
        return indexes[0]

    def sets(self) -> int:
        return sum(1 for name, _ in self.library.calls if name == SET)


@pytest.fixture
def node() -> Iterator[Ascend]:
    settings = DetectSettings(manufacturers=("ascend",), simulate="ascend-910b2x8")
    with sources.open_backends(settings) as backends:
        yield Ascend(backends)


def test_dm_serve_registers_the_share_control_only_where_ascend_is_served() -> None:
    served = DetectSettings(
        manufacturers=("ascend", "metax", "cambricon"), simulate="metax-c500-x8"
    )
    with sources.open_backends(served) as backends:
        assert set(driver_controls(backends)) == {"ascend-container-share"}
    others = DetectSettings(manufacturers=("metax", "cambricon"), simulate="metax-c500-x8")
    with sources.open_backends(others) as backends:
        assert driver_controls(backends) == {}  # sMLU and sGPU steps stay refused


def test_a_step_without_a_usable_physical_id_fails_before_dcmi_is_asked(node: Ascend) -> None:
    control = driver_controls(node.backends)["ascend-container-share"]
    before = len(node.library.calls)
    for parameters in ((), (("physical-id", "-1"),), (("physical-id", "x"),)):
        with pytest.raises(errors.ActuationFailed, match="no usable physical-id parameter"):
            control(DriverStep("ascend-container-share", "NPU-x", parameters))
    assert len(node.library.calls) == before


async def test_a_shared_grant_turns_the_chips_share_flag_on_once(
    tmp_path: Path, kubelet: FakeKubelet, node: Ascend
) -> None:
    g = node.group
    pod = sidecar_pod("ascend", "shared", 1)
    controls = driver_controls(node.backends)
    assert node.library.shared == [False] * 8  # the driver starts with every flag off
    async with session(tmp_path, kubelet, [g], pending=pod, controls=controls) as s:
        shared = await s.allocate("ascend", "shared", [token(g, 1, 3)])
        seen = await s.allocate("ascend", "visibility", [token(g, 5, 0)])  # the owner's card
        whole = await s.allocate("ascend", "exclusive", [token(g, 2)])
        holdings = s.plugins.ledger().holdings()

    assert shared.envs == seen.envs == {"ASCEND_VISIBLE_DEVICES": str(node.physical(1))}
    assert whole.envs == {"ASCEND_VISIBLE_DEVICES": str(node.physical(2))}
    # Card 1's chip now admits a second container; exclusive card 2 was never touched.
    assert node.library.shared == [i == 1 for i in range(8)]
    card, device = node.dcmi.card_device_of(node.physical(1))
    assert node.dcmi.share_enabled(card, device)
    assert node.sets() == 1  # the sidecar's step found the flag on and left it alone
    assert sorted(h.mode for h in holdings) == ["exclusive", "shared"]


async def test_a_chip_that_refuses_the_flag_fails_the_grant_and_charges_nothing(
    tmp_path: Path, kubelet: FakeKubelet, node: Ascend
) -> None:
    g = node.group
    node.library.faults[1][SET] = -8002  # OPER_NOT_PERMITTED: not root on the physical host
    controls = driver_controls(node.backends)
    async with session(tmp_path, kubelet, [g], controls=controls) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("ascend", "shared", [token(g, 1, 3)])
        refused_holdings = s.plugins.ledger().holdings()
        other = await s.allocate("ascend", "shared", [token(g, 4, 0)])
        published = len(s.published)

    assert refused.value.code() == grpc.StatusCode.INTERNAL
    details = refused.value.details() or ""
    assert f"ascend-container-share on {g.accelerators[1].id}" in details
    assert "OPER_NOT_PERMITTED" in details
    assert refused_holdings == ()
    assert node.library.shared == [i == 4 for i in range(8)]
    assert other.envs == {"ASCEND_VISIBLE_DEVICES": str(node.physical(4))}
    assert published == 1  # only the second grant was charged


async def test_without_dcmi_the_share_grant_fails_but_exclusive_is_served(
    tmp_path: Path, kubelet: FakeKubelet, node: Ascend
) -> None:
    """The library vanishing after detection (a driver unloaded): the control cannot act."""
    g = node.group
    node.library.init_error = -8005  # INNER_ERR on every init from now on
    controls = driver_controls(node.backends)
    async with session(tmp_path, kubelet, [g], controls=controls) as s:
        with pytest.raises(grpc.RpcError) as refused:
            await s.allocate("ascend", "shared", [token(g, 0, 0)])
        whole = await s.allocate("ascend", "exclusive", [token(g, 0)])

    assert refused.value.code() == grpc.StatusCode.INTERNAL
    assert "dcmi_init" in (refused.value.details() or "")
    assert whole.envs == {"ASCEND_VISIBLE_DEVICES": str(node.physical(0))}
    assert node.library.shared == [False] * 8

"""MIG actuation end to end: a grpcio client allocates ``nvidia.com/gpu.partitioned`` over the
plugin's unix socket, and the simulated NVML shows the instances created and destroyed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.to_thread
import grpc
import msgspec
import pytest

from agent.deviceplugin import partitioning
from agent.deviceplugin.running import Plugins, device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from agent.devices.libs import nvml
from agent.devices.simulation import fakenvml, profiles
from agent.testing import FakeKubelet, unary
from bus import devices, events
from bus.records import PendingContainer
from bus.testing import eventually
from proto.deviceplugin import v1beta1 as dp

pytestmark = pytest.mark.anyio

SOCKET = "nvidia.partitioned.sock"
CARD0 = "GPU-a3e0d1c2-7b65-4f98-8e21-3c4d5e6f7a80"
CARD1 = "GPU-a3e0d1c2-7b65-4f98-8e21-3c4d5e6f7a81"


@pytest.fixture
def sim() -> fakenvml.SimulatedNvml:
    return fakenvml.SimulatedNvml(profiles.load("nvidia-h100x8-mig").nvidia)


def _claims(*wanted: tuple[str, int]) -> list[PendingContainer]:
    """One pending container per (profile, token count), oldest first, as the worker publishes
    them: what tells each Allocate its profile."""
    return [
        PendingContainer(
            pod_uid=f"uid-{n}", namespace="ns", pod=f"p{n}", container="main",
            resource="nvidia.com/gpu.partitioned", count=tokens, units=tokens * (1_600_000 // 7),
            profile=profile, created_at=datetime(2026, 1, 1, 0, n, tzinfo=UTC),
        )
        for n, (profile, tokens) in enumerate(wanted)
    ]  # fmt: skip


@asynccontextmanager
async def _plugins(
    tmp_path: Path,
    groups: Sequence[devices.DeviceGroup],
    sim: fakenvml.SimulatedNvml,
    retained: Sequence[events.AllocationEvent] = (),
    *,
    claims: Sequence[PendingContainer] = (),
    **kw: object,
) -> AsyncIterator[tuple[Plugins, list[events.Event]]]:
    published: list[events.Event] = []
    settings = DevicePluginSettings.for_tests(str(tmp_path), **kw)
    mig = partitioning.NvmlMig(nvml.Nvml(sim))
    async with device_plugins(
        settings,
        publish=published.append,
        initial_allocations=retained,
        mig=mig,
        pending=lambda: tuple(claims),
    ) as plugins:
        plugins.update(groups)
        yield plugins, published


def _tokens(plugins: Plugins, count: int, skip: int = 0) -> list[str]:
    spec = plugins.servicers()[("nvidia", "partitioned")].spec
    return [t.id for t in spec.tokens][skip : skip + count]


async def _allocate(path: Path, ids: list[str]) -> dict[str, str]:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    reply = await anyio.to_thread.run_sync(
        unary, path, "/v1beta1.DevicePlugin/Allocate", request, dp.AllocateResponse.FromString
    )
    return dict(reply.container_responses[0].envs)


def _migs(sim: fakenvml.SimulatedNvml, index: int) -> list[str]:
    return [u for *_, uuids in sim.instances(index) for u in uuids]


async def test_allocate_creates_an_instance_and_names_its_mig_uuid(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h100_mig: list[devices.DeviceGroup],
    sim: fakenvml.SimulatedNvml,
) -> None:
    async with _plugins(tmp_path, h100_mig, sim, claims=_claims(("1g.10gb", 1))) as (
        plugins,
        published,
    ):
        await kubelet.registered_all(["nvidia.com/gpu.partitioned"])
        envs = await _allocate(tmp_path / SOCKET, _tokens(plugins, 1))

        assert sim.instances(0) == [("1g.10gb", 0, 1, (envs["NVIDIA_VISIBLE_DEVICES"],))]
        assert envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
        (holding,) = plugins.ledger().holdings()
        assert holding.charges == ((CARD0, 1_600_000 // 7),)
        assert [e.action for e in published if isinstance(e, events.AllocationEvent)] == [
            "allocated"
        ]


async def test_second_allocate_packs_and_a_full_card_moves_on(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h100_mig: list[devices.DeviceGroup],
    sim: fakenvml.SimulatedNvml,
) -> None:
    claims = _claims(("1g.10gb", 1), ("1g.10gb", 1), ("7g.80gb", 7), ("3g.40gb", 3))
    async with _plugins(tmp_path, h100_mig, sim, claims=claims) as (plugins, _):
        await kubelet.registered_all(["nvidia.com/gpu.partitioned"])
        path = tmp_path / SOCKET
        await _allocate(path, _tokens(plugins, 1))
        await _allocate(path, _tokens(plugins, 1, skip=1))
        assert [(p, s) for p, s, _, _ in sim.instances(0)] == [("1g.10gb", 0), ("1g.10gb", 1)]

        big = await _allocate(path, _tokens(plugins, 7, skip=7))  # 7g.80gb: card 0 is taken
        assert sim.instances(1) == [("7g.80gb", 0, 8, (big["NVIDIA_VISIBLE_DEVICES"],))]
        three = await _allocate(path, _tokens(plugins, 3, skip=14))  # 3g.40gb packs onto card 0
        assert sim.instances(0)[-1][:3] == ("3g.40gb", 4, 4)
        assert three["NVIDIA_VISIBLE_DEVICES"] in _migs(sim, 0)
        cards = {h.charges[0][0] for h in plugins.ledger().holdings()}
        assert cards == {CARD0, CARD1}


async def test_no_room_is_resource_exhausted_and_charges_nothing(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h100_mig: list[devices.DeviceGroup],
    sim: fakenvml.SimulatedNvml,
) -> None:
    claims = _claims(*[("7g.80gb", 7)] * 4, ("1g.10gb", 1))
    async with _plugins(tmp_path, h100_mig, sim, claims=claims) as (plugins, _):
        await kubelet.registered_all(["nvidia.com/gpu.partitioned"])
        path = tmp_path / SOCKET
        for n in range(4):  # four MIG cards, one 7g.80gb each
            await _allocate(path, _tokens(plugins, 7, skip=7 * n))
        with pytest.raises(grpc.RpcError) as info:
            await _allocate(path, _tokens(plugins, 1, skip=27))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "no card on this node can host" in str(info.value.details())
        assert len(plugins.ledger().holdings()) == 4
        assert all(len(sim.instances(i)) == 1 for i in range(4))
        assert sim.instances(4) == []  # MIG off: never used


async def test_retry_reuses_and_restart_adopts_the_instance(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h100_mig: list[devices.DeviceGroup],
    sim: fakenvml.SimulatedNvml,
) -> None:
    claims = _claims(("2g.20gb", 2))
    async with _plugins(
        tmp_path, h100_mig, sim, claims=claims, partition_orphan_debounce_s=0.0
    ) as (plugins, published):
        await kubelet.registered_all(["nvidia.com/gpu.partitioned"])
        ids = _tokens(plugins, 2)
        first = await _allocate(tmp_path / SOCKET, ids)
        assert await _allocate(tmp_path / SOCKET, ids) == first  # kubelet retrying
        assert len(sim.instances(0)) == 1
    retained = [e for e in published if isinstance(e, events.AllocationEvent)]
    kubelet.restart()
    async with _plugins(tmp_path, h100_mig, sim, retained, partition_orphan_debounce_s=0.0) as (
        plugins,
        _,
    ):
        await kubelet.registered_all(["nvidia.com/gpu.partitioned"])
        (holding,) = plugins.ledger().holdings()
        assert holding.charges == ((CARD0, 2 * (1_600_000 // 7)),)
        await anyio.sleep(0.5)  # several reclaim passes: the adopted instance stays
        assert _migs(sim, 0) == [first["NVIDIA_VISIBLE_DEVICES"]]
        assert await _allocate(tmp_path / SOCKET, ids) == first


async def test_the_profile_is_the_containers_own_and_without_one_nothing_is_made(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h100_mig: list[devices.DeviceGroup],
    sim: fakenvml.SimulatedNvml,
) -> None:
    claims = _claims(("3g.40gb", 1))
    async with _plugins(tmp_path, h100_mig, sim, claims=claims) as (plugins, published):
        await kubelet.registered_all(["nvidia.com/gpu.partitioned"])
        path = tmp_path / SOCKET
        envs = await _allocate(path, _tokens(plugins, 1))  # one token, yet a 3g.40gb
        assert sim.instances(0) == [("3g.40gb", 0, 4, (envs["NVIDIA_VISIBLE_DEVICES"],))]
        (event,) = [e for e in published if isinstance(e, events.AllocationEvent)]
        assert (event.pod_name, event.profile) == ("p0", "3g.40gb")
        assert event.partition_id == envs["NVIDIA_VISIBLE_DEVICES"]
        with pytest.raises(grpc.RpcError) as unclaimed:  # the only claim is served already
            await _allocate(path, _tokens(plugins, 1, skip=1))
        claims[:] = [msgspec.structs.replace(c, pod_uid="uid-x", profile=None) for c in claims]
        with pytest.raises(grpc.RpcError) as nameless:
            await _allocate(path, _tokens(plugins, 1, skip=2))
    assert unclaimed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pending container on this node asks for 1" in str(unclaimed.value.details())
    assert nameless.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "names no partition profile" in str(nameless.value.details())
    assert [len(sim.instances(i)) for i in range(4)] == [1, 0, 0, 0]


async def test_release_destroys_the_instance_retrying_in_use(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h100_mig: list[devices.DeviceGroup],
    sim: fakenvml.SimulatedNvml,
) -> None:
    async with _plugins(tmp_path, h100_mig, sim, claims=_claims(("1g.10gb", 1))) as (
        plugins,
        published,
    ):
        await kubelet.registered_all(["nvidia.com/gpu.partitioned"])
        ids = _tokens(plugins, 1)
        envs = await _allocate(tmp_path / SOCKET, ids)
        sim.make_busy(envs["NVIDIA_VISIBLE_DEVICES"], 3)  # a process is still exiting
        node = plugins._node
        node._apply(node.ledger.release(plugins.ledger().holdings()[0].allocation_id))

        owners = tmp_path / "pods" / "partitions"
        # The instance goes first, then its owner file: wait for both, in that order.
        await eventually(lambda: _async(sim.instances(0) == [] and not list(owners.glob("*.json"))))
        assert plugins.ledger().holdings() == ()
        assert [e.action for e in published if isinstance(e, events.AllocationEvent)] == [
            "allocated",
            "released",
        ]


async def test_orphans_are_destroyed_after_the_debounce(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h100_mig: list[devices.DeviceGroup],
    sim: fakenvml.SimulatedNvml,
) -> None:
    adapter = nvml.Nvml(sim)
    with adapter.session():
        h = adapter.handle_by_uuid(CARD0)
        gi = adapter.create_gpu_instance(h, 0, 3, 1)
        adapter.create_compute_instance(gi.handle, 1)
    async with _plugins(tmp_path, h100_mig, sim, partition_orphan_debounce_s=1.0):
        await kubelet.registered_all(["nvidia.com/gpu.partitioned"])
        assert len(sim.instances(0)) == 1  # not yet: it may be someone's in-flight create
        await eventually(lambda: _async(sim.instances(0) == []))


async def _async(value: bool) -> bool:
    return value

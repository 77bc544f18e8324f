"""Claims: reservations changed only through reserve/release, and a partitioned Allocate that
waits for its claim on a change (no polling), cancellable without leaving anything behind.

The Node-level tests drive a real :class:`Node` over the simulated NVML (MIG) with the agent's
own :class:`agent.deviceplugin.kvpending.PendingView` as the pending source, as ``dm serve`` wires them.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from agent.deviceplugin import errors, partitioning
from agent.deviceplugin import holdings as ledger
from agent.deviceplugin.claims import Announcing, Claims
from agent.deviceplugin.kvpending import PendingView
from agent.deviceplugin.node import Node
from agent.deviceplugin.partitioning import Partitions
from agent.deviceplugin.settings import DevicePluginSettings
from agent.devices.libs import nvml
from agent.devices.simulation import fakenvml, profiles
from bus import devices
from bus.records import PendingContainer

RESOURCE = "nvidia.com/gpu.partitioned"
KEY = ("nvidia", "partitioned")


def claim(n: int, profile: str | None = "1g.10gb", resource: str = RESOURCE) -> PendingContainer:
    return PendingContainer(
        pod_uid=f"uid-{n}", namespace="ns", pod=f"p{n}", container="main", resource=resource,
        count=1, units=1_600_000 // 7, profile=profile,
        created_at=datetime(2026, 1, 1, 0, n, tzinfo=UTC),
    )  # fmt: skip


def test_a_reserved_claim_is_not_chosen_again_until_released() -> None:
    first, second = claim(0), claim(1)
    claims = Claims(lambda: (first, second))
    assert claims.choose(RESOURCE, 1) == first and claims.reserved("a") is None
    claims.reserve("a", first)
    assert claims.reserved("a") == first and claims.choose(RESOURCE, 1) == second
    claims.reserve("b", second)
    assert claims.choose(RESOURCE, 1) is None
    claims.release("a")
    claims.release("never-reserved")  # nothing to free: no error
    assert claims.reserved("a") is None and claims.choose(RESOURCE, 1) == first


def test_the_agents_pending_view_announces_only_real_changes() -> None:
    view = PendingView()
    assert isinstance(view, Announcing) and not isinstance(lambda: (), Announcing)
    before = view.next_change()
    view.update(())
    assert view.reads == 1 and not before.is_set()  # the same (empty) list: nobody woken
    view.update((claim(0),))
    assert before.is_set() and view() == (claim(0),) and not view.next_change().is_set()


@pytest.mark.anyio
async def test_a_waiting_choice_wakes_on_a_new_pending_list() -> None:
    view = PendingView()
    claims = Claims(view)
    found: list[PendingContainer | None] = []
    with anyio.fail_after(30):  # a hang guard: without a wake-up it would wait for ever
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                found.append(await claims.wait_for(RESOURCE, 1, math.inf))

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            view.update((claim(0, resource="other"),))  # not for this resource: waits on
            await anyio.wait_all_tasks_blocked()
            assert found == []
            view.update((claim(1),))
    assert found == [claim(1)]


@pytest.mark.anyio
async def test_a_waiting_choice_wakes_when_a_reservation_is_released() -> None:
    held = claim(0)
    claims = Claims(lambda: (held,))  # a plain source: the tables' own changes wake it
    claims.reserve("a", held)
    found: list[PendingContainer | None] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                found.append(await claims.wait_for(RESOURCE, 1, math.inf))

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            claims.release("a")
    assert found == [held]


@pytest.mark.anyio
async def test_a_wait_ends_empty_at_its_deadline_and_reads_once_more() -> None:
    late: list[PendingContainer] = []
    claims = Claims(lambda: tuple(late))
    assert await claims.wait_for(RESOURCE, 1, 0.0) is None
    late.append(claim(0))  # appeared without an announcement: seen by the last read
    assert await claims.wait_for(RESOURCE, 1, 0.0) == claim(0)


@pytest.fixture
def sim() -> fakenvml.SimulatedNvml:
    return fakenvml.SimulatedNvml(profiles.load("nvidia-h100x8-mig").nvidia)


async def _node(
    tmp_path: Path, groups: list[devices.DeviceGroup], sim: fakenvml.SimulatedNvml
) -> tuple[Node, PendingView]:
    settings = DevicePluginSettings.for_tests(str(tmp_path), pending_wait_s=3600.0)
    partitions = Partitions(partitioning.NvmlMig(nvml.Nvml(sim)), settings.host_work_dir)
    await partitions.load()
    view = PendingView()
    node = Node(settings, publish=lambda e: None, partitions=partitions, pending_containers=view)
    node.update(groups)
    return node, view


def _ids(node: Node) -> list[str]:
    return [node.offers.servicers[KEY].spec.tokens[0].id]


@pytest.mark.anyio
async def test_a_partitioned_allocate_waits_for_its_claim_then_creates_the_instance(
    tmp_path: Path, h100_mig: list[devices.DeviceGroup], sim: fakenvml.SimulatedNvml
) -> None:
    node, view = await _node(tmp_path, h100_mig, sim)
    envs: list[dict[str, str]] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def allocate() -> None:
                envs.append((await node.allocate_partitioned(KEY, _ids(node))).envs)

            tg.start_soon(allocate)
            await anyio.wait_all_tasks_blocked()
            assert envs == [] and sim.instances(0) == []  # waiting, nothing made yet
            view.update((claim(0),))
    assert envs[0]["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert node.claims.reserved(ledger.allocation_id(RESOURCE, _ids(node))) == claim(0)


@pytest.mark.anyio
async def test_a_cancelled_wait_reserves_nothing_and_creates_nothing(
    tmp_path: Path, h100_mig: list[devices.DeviceGroup], sim: fakenvml.SimulatedNvml
) -> None:
    node, view = await _node(tmp_path, h100_mig, sim)
    alloc = ledger.allocation_id(RESOURCE, _ids(node))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(node.allocate_partitioned, KEY, _ids(node))
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()  # kubelet gave up on the Allocate
    assert node.claims.reserved(alloc) is None and not node.ledger.holdings()
    assert [sim.instances(i) for i in range(8)] == [[]] * 8
    view.update((claim(0),))  # the claim arrives after all: a retry is served by it
    with anyio.fail_after(30):
        injection = await node.allocate_partitioned(KEY, _ids(node))
    assert injection.envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert node.claims.reserved(alloc) == claim(0)


@pytest.mark.anyio
async def test_a_claim_naming_no_profile_is_refused_after_the_wait(
    tmp_path: Path, h100_mig: list[devices.DeviceGroup], sim: fakenvml.SimulatedNvml
) -> None:
    node, view = await _node(tmp_path, h100_mig, sim)
    view.update((claim(0, profile=None),))
    with pytest.raises(errors.Conflict, match="names no partition profile"):
        await node.allocate_partitioned(KEY, _ids(node))
    assert node.claims.reserved(ledger.allocation_id(RESOURCE, _ids(node))) is None

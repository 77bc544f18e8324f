"""instances: the pure decisions of a partitioned Allocate (loop-free).

Which recorded instance an Allocate reuses, which cards a new one may go on, and why an Allocate
is refused once its wait for a claim is over. The waiting and the creating themselves run
against the simulated NVML in ``test_deviceplugin_claims.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from agent.deviceplugin import holdings as ledger
from agent.deviceplugin import instances
from agent.deviceplugin.partitioning import Record
from agent.deviceplugin.resources import Card
from bus.records import PendingContainer

RESOURCE = "nvidia.com/gpu.partitioned"
IDS = ("GPU-a::p0", "GPU-a::p1")


def record(device_ids: tuple[str, ...] = IDS, resource: str = RESOURCE) -> Record:
    return Record(
        allocation_id=ledger.allocation_id(resource, device_ids), resource=resource,
        device_ids=tuple(sorted(device_ids)), card_id="GPU-a", gpu_instance_id=1,
        compute_instance_id=0, mig_uuid="MIG-1", profile_id=9, profile_name="3g.40gb",
        start=0, size=4,
    )  # fmt: skip


def card(id_: str, manufacturer: str = "nvidia", partition_count: int = 7) -> Card:
    return Card(
        id=id_, group="g", manufacturer=manufacturer, index=0, physical_indexes=(0,),
        numa_nodes=(), unhealthy=False, memory_mib=81920, runtime_version=None,
        sliced_count=0, partition_count=partition_count,
    )  # fmt: skip


def claim(profile: str | None) -> PendingContainer:
    return PendingContainer(
        pod_uid="u", namespace="ns", pod="p", container="main", resource=RESOURCE, count=1,
        units=1, profile=profile, created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip


def test_the_instance_recorded_for_the_same_tokens_is_reused_in_any_order() -> None:
    mine = record()
    records = {mine.allocation_id: mine}
    assert instances.recorded(records, RESOURCE, IDS) == mine
    assert instances.recorded(records, RESOURCE, tuple(reversed(IDS))) == mine


def test_no_instance_for_other_tokens_no_tokens_or_a_record_of_other_tokens() -> None:
    mine = record()
    assert instances.recorded({mine.allocation_id: mine}, RESOURCE, IDS[:1]) is None
    assert instances.recorded({mine.allocation_id: mine}, RESOURCE, ()) is None
    stale = record(device_ids=("GPU-b::p0",))  # filed under this allocation's id by mistake
    assert instances.recorded({mine.allocation_id: stale}, RESOURCE, IDS) is None


def test_a_new_instance_goes_only_on_the_manufacturers_cards_in_partition_mode() -> None:
    cards = {
        "a": card("a"),
        "b": card("b", partition_count=0),
        "c": card("c", manufacturer="huawei"),
        "d": card("d"),
    }
    assert [c.id for c in instances.partitionable(cards, "nvidia")] == ["a", "d"]
    assert instances.partitionable({}, "nvidia") == []


def test_after_the_wait_a_missing_claim_or_one_without_profile_is_refused() -> None:
    missing = instances.refusal(None, RESOURCE, 2)
    assert missing == (
        f"no pending container on this node asks for 2 {RESOURCE}; its partition profile is unknown"
    )
    nameless = instances.refusal(claim(None), RESOURCE, 1)
    assert nameless is not None and nameless.startswith("ns/p container main names no partition")
    assert instances.refusal(claim(""), RESOURCE, 1) == nameless
    assert instances.refusal(claim("1g.10gb"), RESOURCE, 1) is None

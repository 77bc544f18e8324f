"""Choosing the pending container a sliced Allocate serves, its charge, gate and caps (no loop)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent.deviceplugin import errors, pending
from bus.records import PendingContainer

SLICED = "nvidia.com/gpu.sliced"
H200_MIB = 143_771


def req(pod: str, *, minute: int = 0, units: int = 400_000, **kw: int) -> PendingContainer:
    return PendingContainer(
        pod_uid=f"uid-{pod}", namespace="ns", pod=pod, container="main", resource=SLICED,
        units=units, created_at=datetime(2026, 1, 1, 0, minute, tzinfo=UTC), **kw,
    )  # fmt: skip


def test_kubelet_names_the_container_before_age_does() -> None:
    old, new = req("old", minute=0), req("new", minute=5)
    assert pending.choose([new, old], SLICED, 1) == old
    assert pending.choose([new, old], SLICED, 1, by_kubelet={("uid-new", "main")}) == new


def test_the_oldest_feasible_unreserved_container_else_the_oldest() -> None:
    big, small = req("big", minute=0, units=1_200_000), req("small", minute=1)
    assert pending.choose([big, small], SLICED, 1, remaining={"c0": 800_000}) == small
    assert pending.choose([big, small], SLICED, 1, remaining={"c0": 100}) == big
    assert pending.choose([big, small], SLICED, 1, reserved={("uid-big", "main")}) == small
    assert pending.choose([big], "amd.com/gpu.sliced", 1) is None
    assert pending.choose([big], SLICED, 2) is None  # kubelet asked for another size


def test_the_charge_is_the_containers_units_and_the_gate_refuses_what_does_not_fit() -> None:
    assert pending.sliced_charges(req("a"), {"c0": 1}) == {"c0": 400_000}
    assert pending.sliced_charges(req("a", units=1_000_000), {"c0": 2}) == {"c0": 1_600_000}
    pending.sliced_gate("c0", charge=400_000, remaining=400_000, slices_held=3, slice_count=128)
    with pytest.raises(errors.Conflict, match="has 300000 units left, 400000 asked"):
        pending.sliced_gate("c0", charge=400_000, remaining=300_000, slices_held=3, slice_count=128)
    with pytest.raises(errors.Conflict, match="no free slice"):
        pending.sliced_gate("c0", charge=1, remaining=10**6, slices_held=128, slice_count=128)


def test_memory_follows_the_percentage_else_the_mib_and_cores_default_to_all() -> None:
    assert pending.memory_cap_mib(req("a", memory_percentage=25), H200_MIB) == 35_942
    assert pending.memory_cap_mib(req("a", memory_mib=10_000), H200_MIB) == 10_000
    assert pending.memory_cap_mib(req("a", memory_mib=999_999), H200_MIB) == H200_MIB
    with pytest.raises(errors.CannotInject):
        pending.memory_cap_mib(req("a"), H200_MIB)
    assert pending.cores_percentage(req("a", cores_percentage=50)) == 50
    assert pending.cores_percentage(req("a")) == 100

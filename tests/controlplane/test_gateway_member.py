"""A member worker's summaries: from the bus ledger (no cluster) and from the chain's objects."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from bus import events
from bus.devices import DeviceGroup
from controlplane import fleet
from controlplane.reconciling.ledger import Ledger

HERE = Path(__file__).parent
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _groups(name: str) -> tuple[DeviceGroup, ...]:
    return msgspec.json.decode((HERE / name).read_bytes(), type=tuple[DeviceGroup, ...])


def test_the_ledger_gives_one_summary_per_accelerator_type_with_its_views() -> None:
    ledger = Ledger(max_nodes=10)
    h200 = _groups("controlplane_detect_h200x8.json")
    ledger.apply(events.DevicesEvent(node="n1", ts=T0, groups=h200))
    ledger.apply(
        events.DevicesEvent(node="n2", ts=T0, groups=_groups("controlplane_detect_amd_x2.json"))
    )
    group = h200[0]
    ids = tuple(f"{group.id}:{group.accelerators[c].id}:0000" for c in (0, 1))
    ledger.apply(events.AllocationEvent(
        node="n1", ts=T0, allocation_id="a1", action="allocated", resource="nvidia.com/gpu",
        device_ids=ids,
    ))  # fmt: skip
    summaries = {s.name: s for s in fleet.LedgerInstanceTypes(ledger).instance_types()}
    assert len(summaries) == 2, sorted(summaries)
    nvidia = next(s for n, s in summaries.items() if "nvidia" in n)
    assert nvidia.views.accelerator.capacity == 8
    assert nvidia.views.accelerator.remaining == 6
    assert nvidia.views.accelerator.once_max_request == 6
    amd = next(s for n, s in summaries.items() if "amd" in n)
    assert amd.views.accelerator.capacity == 2 and not amd.inactive


class Objects:
    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = bodies

    def instance_type_objects(self) -> list[dict[str, Any]]:
        return self.bodies


def test_the_chain_objects_carry_inactive_and_skip_cpu_types_and_bad_statuses() -> None:
    view = {"onceMaxRequest": 8, "remaining": 8, "capacity": 8}
    bodies = [
        {"metadata": {"name": "gpustack--nvidia-h200-linux-amd64"}, "spec": {"inactive": True},
         "status": {"accelerator": view, "entrance": "lq", "summary": "8/8"}},
        {"metadata": {"name": "gpustack--generic-linux-amd64"}, "status": {"entrance": "lq"}},
        {"metadata": {"name": "broken"}, "status": {"accelerator": {"remaining": -3}}},
    ]  # fmt: skip
    out = fleet.ChainInstanceTypes(Objects(bodies)).instance_types()
    assert [(s.name, s.inactive, s.views.accelerator.remaining) for s in out] == [
        ("gpustack--nvidia-h200-linux-amd64", True, 8)
    ]

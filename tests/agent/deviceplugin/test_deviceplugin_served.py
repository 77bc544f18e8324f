"""A sliced grant names the container it served, in its event, across a restart (the node, no loop).

The node is driven directly with simulated H200s and a fixed pending list; what is checked is
what it publishes (the worker annotates the Pod from it) and what a restarted node rebuilds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from agent.deviceplugin.node import Node
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices, events
from bus.records import PendingContainer

SLICED = "nvidia.com/gpu.sliced"
KEY = ("nvidia", "sliced")


def req(pod: str, minute: int, *, memory: int = 25, cores: int = 50) -> PendingContainer:
    return PendingContainer(
        pod_uid=f"uid-{pod}", namespace="ns", pod=pod, container="main", resource=SLICED,
        units=memory * 16_000, memory_percentage=memory, cores_percentage=cores,
        created_at=datetime(2026, 1, 1, 0, minute, tzinfo=UTC),
    )  # fmt: skip


def node(
    tmp_path: Path,
    groups: list[devices.DeviceGroup],
    pending: list[PendingContainer],
    *,
    kept: tuple[events.AllocationEvent, ...] = (),
) -> tuple[Node, list[events.Event]]:
    published: list[events.Event] = []
    n = Node(
        DevicePluginSettings.for_tests(str(tmp_path)),
        publish=published.append,
        initial_allocations=kept,
        pending_containers=lambda: pending,
    )
    n.update(groups)
    return n, published


def tokens(n: Node) -> tuple[str, list[str]]:
    view = n._view(KEY)
    ordered = sorted(view.tokens.values(), key=lambda t: (view.cards[t.card].index, t.index))
    card = ordered[0].card
    return card, [t.id for t in ordered if t.card == card]


def test_the_event_names_the_pod_its_charge_and_caps(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    n, published = node(tmp_path, h200, [req("a", 0)])
    card, ids = tokens(n)
    n.allocate(KEY, ids[:1])
    (event,) = [e for e in published if isinstance(e, events.AllocationEvent)]
    assert (event.pod_uid, event.pod_namespace, event.pod_name, event.container) == (
        "uid-a", "ns", "a", "main",
    )  # fmt: skip
    assert event.charges == (events.CardCharge(accelerator_id=card, units=400_000),)
    assert (event.memory_mib, event.cores_percentage) == (35_942, 50)


def test_a_restart_rebuilds_the_charge_and_the_reservation_from_the_kept_events(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    first, second = req("a", 0), req("b", 1, memory=50, cores=100)
    n, published = node(tmp_path, h200, [first, second])
    card, ids = tokens(n)
    n.allocate(KEY, ids[:1])
    kept = tuple(e for e in published if isinstance(e, events.AllocationEvent))

    again, _ = node(tmp_path / "again", h200, [first, second], kept=kept)
    assert again.ledger.used(card) == 400_000  # its own units, not a 1/128 token share
    retry = again.allocate(KEY, ids[:1])  # kubelet retrying the same container
    assert retry.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "35942m"
    assert retry.envs["CUDA_DEVICE_SM_LIMIT"] == "50"
    served = again.allocate(KEY, ids[1:2])  # the next slice is b's: a is reserved, not served twice
    assert again.ledger.used(card) == 400_000 + 800_000
    assert served.envs["CUDA_DEVICE_SM_LIMIT"] == "100"

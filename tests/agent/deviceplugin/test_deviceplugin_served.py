"""A sliced grant names the container it served, in its event, across a restart (the node, no loop).

The node is driven directly with simulated H200s and a fixed pending list; what is checked is
what it publishes (the worker annotates the Pod from it) and what a restarted node rebuilds.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from agent.deviceplugin import errors, mirroring, resources
from agent.deviceplugin import holdings as ledger
from agent.deviceplugin.node import Node
from agent.deviceplugin.running import device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from agent.testing import FakeKubelet, unary
from bus import devices, events
from bus.records import PendingContainer
from proto.deviceplugin import v1beta1 as dp
from proto.podresources import v1 as podresources

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
    view = n.offers.view(KEY)
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


VISIBILITY = "device.gpustack.ai/nvidia.visibility"


ADMITTING = {("ns", "s", "main"): frozenset[str](), ("ns", "s", "ssh"): frozenset[str]()}
"""kubelet's pod-resources view while it admits Pod ``s``: its containers hold nothing yet."""


def claim(container: str, resource: str, count: int, *, pod: str = "s") -> PendingContainer:
    return PendingContainer(
        pod_uid=f"uid-{pod}", namespace="ns", pod=pod, container=container, resource=resource,
        count=count, units=0, created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip


def by_index(n: Node, mode: str) -> list[str]:
    """One token per card, in card index order."""
    view = n.offers.view(("nvidia", mode))  # type: ignore[arg-type]
    first: dict[str, str] = {}
    for t in sorted(view.tokens.values(), key=lambda t: (view.cards[t.card].index, t.index)):
        first.setdefault(t.card, t.id)
    return list(first.values())


def test_a_sidecar_sees_exactly_its_owners_cards_whatever_tokens_kubelet_picked(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    claims = [claim("main", "nvidia.com/gpu", 2), claim("ssh", VISIBILITY, 2)]
    n, published = node(tmp_path, h200, claims)
    n.claims.note_kubelet(ADMITTING)
    whole = by_index(n, "exclusive")
    n.allocate(("nvidia", "exclusive"), whole[3:5])  # the owner: cards #3 and #4
    (event,) = [e for e in published if isinstance(e, events.AllocationEvent)]
    assert (event.pod_uid, event.container) == ("uid-s", "main")
    seen = by_index(n, "visibility")
    got = n.allocate(("nvidia", "visibility"), seen[0:2])  # tokens of cards #0 and #1
    view = n.offers.view(("nvidia", "exclusive"))
    owner = ",".join(view.tokens[t].card for t in whole[3:5])
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": owner}
    assert n.allocate(("nvidia", "visibility"), seen[0:2]) == got  # a retry: the same answer
    assert len(n.ledger.holdings()) == 1  # visibility charges nothing


def test_a_sidecar_fails_closed_without_an_owner_or_with_another_count(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    claims = [claim("main", "nvidia.com/gpu", 1), claim("ssh", VISIBILITY, 2)]
    n, _ = node(tmp_path, h200, claims)
    seen = by_index(n, "visibility")
    with pytest.raises(errors.Conflict, match="no other container of its Pod holds"):
        n.allocate(("nvidia", "visibility"), seen[0:2])
    n.allocate(("nvidia", "exclusive"), by_index(n, "exclusive")[:1])
    with pytest.raises(errors.Conflict, match="no other container of its Pod holds"):
        n.allocate(("nvidia", "visibility"), seen[0:2])  # kubelet never named the owner
    n.claims.note_kubelet(ADMITTING)
    n.allocate(("nvidia", "exclusive"), by_index(n, "exclusive")[1:2])
    with pytest.raises(errors.Conflict, match="asks to see 2 card.s.; its owner holds 1"):
        n.allocate(("nvidia", "visibility"), seen[0:2])
    with pytest.raises(errors.Conflict, match="no pending container on this node asks for 3"):
        n.allocate(("nvidia", "visibility"), seen[0:3])


def test_a_partitioned_owner_is_mirrored_as_its_partition_never_the_card(
    h200: list[devices.DeviceGroup],
) -> None:
    card = resources.cards_of(h200)
    first = min(card.values(), key=lambda c: c.index)
    owner = ledger.Holding(
        allocation_id="a", resource="nvidia.com/gpu.partitioned", mode="partitioned",
        device_ids=("x",), charges=((first.id, 195_858),), since=0.0, pod_uid="uid-s",
        container="main", partition_id="MIG-1234",
    )  # fmt: skip
    got = mirroring.mirror(claim("ssh", VISIBILITY, 1), [owner], card, manufacturer="nvidia",
                           size=1)  # fmt: skip
    assert got == mirroring.Mirror(partition_id="MIG-1234")
    unknown = dataclasses.replace(owner, partition_id=None)
    with pytest.raises(errors.Conflict, match="partition is not known"):
        mirroring.mirror(claim("ssh", VISIBILITY, 1), [unknown], card, manufacturer="nvidia",
                         size=1)  # fmt: skip
    with pytest.raises(errors.Conflict, match="no longer here"):
        mirroring.mirror(claim("ssh", VISIBILITY, 1), [dataclasses.replace(owner, mode="exclusive")],
                         {}, manufacturer="nvidia", size=1)  # fmt: skip


def test_preferred_allocation_defers_a_card_the_pending_container_would_not_fit(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    claims = [req("big", 0, memory=80), req("next", 1)]
    n, _ = node(tmp_path, h200, claims)
    view = n.offers.view(KEY)
    card0, ids0 = tokens(n)
    n.allocate(KEY, ids0[:1])  # big: 1,280,000 of card 0, 320,000 left
    ids1 = [t.id for t in view.tokens.values() if view.cards[t.card].index == 1]
    got = n.prefer(KEY, [*ids0[1:3], *ids1[:2]], [], 1)
    assert [view.tokens[d].card for d in got] != [card0]  # 400,000 would not fit there
    assert view.cards[view.tokens[got[0]].card].index == 1
    claims.clear()  # nobody pending: the token share fits card 0, the most occupied
    assert [view.tokens[d].card for d in n.prefer(KEY, [*ids0[1:3], *ids1[:2]], [], 1)] == [card0]


@pytest.mark.anyio
async def test_kubelets_view_names_the_container_before_age_does(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    kubelet.serve_pod_resources(tmp_path / "pod-resources.sock")
    kubelet.live = [  # kubelet is admitting "new": its container holds nothing yet
        podresources.PodResources(
            name="new", namespace="ns", containers=[podresources.ContainerResources(name="main")]
        )
    ]
    claims = [req("old", 0), req("new", 5)]
    published: list[events.Event] = []
    settings = DevicePluginSettings.for_tests(
        str(tmp_path), pod_resources_socket=str(tmp_path / "pod-resources.sock")
    )
    async with device_plugins(
        settings, publish=published.append, pending=lambda: tuple(claims)
    ) as plugins:
        plugins.update(h200)
        await kubelet.registered_all([SLICED])
        path = kubelet.endpoint(SLICED)
        assert path is not None
        (servicer,) = [s for s in plugins.servicers().values() if s.spec.resource == SLICED]
        request = dp.AllocateRequest(container_requests=[
            dp.ContainerAllocateRequest(devices_ids=[servicer.spec.tokens[0].id])])  # fmt: skip
        await anyio.to_thread.run_sync(
            unary, path, "/v1beta1.DevicePlugin/Allocate", request, dp.AllocateResponse.FromString
        )
    first = next(e for e in published if isinstance(e, events.AllocationEvent))
    assert (first.pod_name, first.pod_uid) == ("new", "uid-new")

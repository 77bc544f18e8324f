"""An InstanceType's status: four views of what its nodes can still grant (pure).

Each view is ``{onceMaxRequest, remaining, capacity}`` in the unit its family is requested in:

============================  ======================  ==========================================
view (status field)           unit                    onceMaxRequest
============================  ======================  ==========================================
exclusive (``accelerator``)   whole cards             most free cards on one node
shared (``acceleratorShared``)  shares (10 a card)    most cards on one node with a free share
                                                      (a ``.shared: N`` request needs N cards)
sliced (``acceleratorSliced``)  memory percent        most free percent on one card with a free
                              (100 a card)            slot (what one ``memory-percentage`` asks)
partitioned                   instances               1 when any instance fits (a request is one)
(``acceleratorPartitioned``)
============================  ======================  ==========================================

A card counts for a family only in a mode that family can join: a free card (mode ``None``) for
all, a shared card for shares, a sliced card for slices (below its slot count), a partitioned
card for partitions. Unhealthy cards count for capacity, never for remaining.

Partitions are counted per profile as well (``allocatedProfiles``, ``remainingProfiles``, every
profile listed, even at 0). The ledger charges a partitioned allocation ``k`` tokens of a card;
``k`` tokens are one instance of the smallest profile whose compute slices cover
``ceil(k x slices / count)`` (the device agent's rule), which is how an allocation is attributed
to a profile. A profile's remaining instances on a card are what its free compute slices hold,
at most the profile's own count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from bus import events
from bus.devices import DeviceGroup, SliceProfile
from controlplane.chain.inventory import Card, NodeFacts
from controlplane.reconciling.allocating import SHARES, UNITS, ordered_profiles, profiles_left
from controlplane.reconciling.labeling import product_key

__all__ = [
    "SHARE_UNITS",
    "View",
    "can_share",
    "can_slice",
    "free_percent",
    "instance_type_status",
    "profile_of_tokens",
]

SHARE_UNITS: Final = UNITS // SHARES
PERCENT: Final = UNITS // 100

View = dict[str, int]


def _view(once: int, remaining: int, capacity: int) -> View:
    return {"onceMaxRequest": once, "remaining": remaining, "capacity": capacity}


def is_free(card: Card) -> bool:
    return not card.unhealthy and card.mode == "None" and card.allocated == 0


def can_share(card: Card) -> bool:
    """The card can still grant one share."""
    return not card.unhealthy and card.mode in ("None", "Shared") and card.remaining >= SHARE_UNITS


def can_slice(card: Card) -> bool:
    """The card is sliceable and has a free slot."""
    return (
        not card.unhealthy
        and card.slice_count > 0
        and card.partition_count == 0
        and card.mode in ("None", "Sliced")
        and card.slices < card.slice_count
    )


def free_percent(card: Card) -> int:
    return card.remaining // PERCENT if can_slice(card) else 0


def _exclusive(nodes: Sequence[list[Card]]) -> View:
    free = [sum(1 for c in cards if is_free(c)) for cards in nodes]
    return _view(max(free, default=0), sum(free), sum(len(cards) for cards in nodes))


def _shared(nodes: Sequence[list[Card]]) -> View:
    per_node = [[c.remaining // SHARE_UNITS for c in cards if can_share(c)] for cards in nodes]
    capacity = sum(len(cards) for cards in nodes) * SHARES
    return _view(max((len(s) for s in per_node), default=0), sum(map(sum, per_node)), capacity)


def _sliced(nodes: Sequence[list[Card]]) -> View:
    cards = [c for node in nodes for c in node if c.slice_count > 0 and c.partition_count == 0]
    free = [free_percent(c) for c in cards]
    return _view(max(free, default=0), sum(free), len(cards) * 100)


def _slices_of(profiles: Sequence[SliceProfile]) -> int:
    return max((p.compute_slices for p in profiles), default=0)


def profile_of_tokens(profiles: Sequence[SliceProfile], tokens: int, count: int) -> str | None:
    """The profile ``tokens`` partitioned tokens of a ``count``-token card stand for."""
    slices = _slices_of(profiles)
    if not profiles or count <= 0 or slices <= 0:
        return None
    need = -(-tokens * slices // count)
    fitting = [p for p in profiles if p.compute_slices >= need]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.compute_slices, p.memory_slices, p.name)).name


def _partitioned(
    group: str,
    nodes: Sequence[NodeFacts],
    allocations: Iterable[events.AllocationEvent],
) -> dict[str, Any]:
    profiles: dict[str, SliceProfile] = {}
    for g in (g for n in nodes for g in n.groups if product_key(g) == group):
        for a in g.accelerators:
            for p in a.status.physical_sliced.profiles if a.status.physical_sliced else ():
                profiles.setdefault(p.name, p)
    ordered = ordered_profiles(profiles.values())
    slices = _slices_of(ordered)
    cards = [c for n in nodes for c in n.group_cards(group) if c.partition_count > 0]
    remaining = {p.name: 0 for p in ordered}
    capacity = 0
    for card in cards:
        capacity += card.partition_count
        if card.unhealthy or card.mode not in ("None", "Partitioned") or not slices:
            continue
        for fitting, fits in profiles_left(ordered, card.remaining).items():
            remaining[fitting] += fits
    allocated = {p.name: 0 for p in ordered}
    count = max((c.partition_count for c in cards), default=0)
    for event in allocations:
        name = profile_of_tokens(ordered, len(event.device_ids), count)
        if name is not None:
            allocated[name] += 1
    free_instances = sum(
        card.remaining * card.partition_count // UNITS
        for card in cards
        if not card.unhealthy and card.mode in ("None", "Partitioned")
    )
    return {
        **_view(1 if any(remaining.values()) else 0, free_instances, capacity),
        "allocatedProfiles": [{"name": n, "count": c} for n, c in allocated.items()],
        "remainingProfiles": [{"name": n, "count": c} for n, c in remaining.items()],
    }


def _detail(group: str, nodes: Sequence[NodeFacts]) -> dict[str, Any]:
    """The capability catalog: what one card of the group offers."""
    first: DeviceGroup | None = next(
        (g for n in nodes for g in n.groups if product_key(g) == group), None
    )
    if first is None or not first.accelerators:
        return {}
    status = first.accelerators[0].status
    out: dict[str, Any] = {"memoryMib": first.memory or 0}
    if status.logical_sliced is not None:
        out["logicalSlices"] = status.logical_sliced.count
        out["coresPercentageOvercommit"] = status.logical_sliced.cores_percentage_overcommit
    if status.physical_sliced is not None:
        out["profiles"] = [
            {"name": p.name, "memoryMib": p.memory_mib, "count": p.count}
            for p in status.physical_sliced.profiles
        ]
    return out


def instance_type_status(
    group: str,
    nodes: Sequence[NodeFacts],
    allocations: Mapping[str, Iterable[events.AllocationEvent]],
    entrance: str,
) -> dict[str, Any]:
    """The ``status`` of the InstanceType of accelerator group ``group`` over ``nodes``.

    ``allocations`` maps a node name to its live allocation events (the partitioned ones are
    attributed to profiles).
    """
    per_node = [n.group_cards(group) for n in nodes]
    ids = {g.id for n in nodes for g in n.groups if product_key(g) == group}
    partitioned = [
        e
        for n in nodes
        for e in allocations.get(n.name, ())
        if e.action == "allocated"
        and e.resource.endswith(".partitioned")
        and any(d.split(":", 1)[0] in ids for d in e.device_ids)
    ]
    four = {
        "accelerator": _exclusive(per_node),
        "acceleratorShared": _shared(per_node),
        "acceleratorSliced": _sliced(per_node),
        "acceleratorPartitioned": _partitioned(group, nodes, partitioned),
    }
    summary = " ".join(f"{v['onceMaxRequest']}/{v['remaining']}" for v in four.values())
    detail = {"slicedDetail": _detail(group, nodes)}
    return {**four, "detail": detail, "entrance": entrance, "summary": summary}

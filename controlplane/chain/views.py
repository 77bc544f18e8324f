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

Nodes are folded so that none sizes another's cards: each card is counted with its own node's
profiles, slices and partition count, and what describes the whole group (``slicedDetail``) is
the description most nodes give (:func:`told_group`), so a node lying about itself, inside the
bus bounds, changes only its own cards' share of the views (docs/bus.md, *Semantic bounds*).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

import msgspec

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
    "told_group",
]

SHARE_UNITS: Final = UNITS // SHARES
PERCENT: Final = UNITS // 100

View = dict[str, int]
T = TypeVar("T")


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


def _node_profiles(group: str, node: NodeFacts) -> list[SliceProfile]:
    """The partition profiles ``node`` itself offers on its cards of ``group``, smallest first."""
    profiles: dict[str, SliceProfile] = {}
    for g in (g for g in node.groups if product_key(g) == group):
        for a in g.accelerators:
            for p in a.status.physical_sliced.profiles if a.status.physical_sliced else ():
                profiles.setdefault(p.name, p)
    return ordered_profiles(profiles.values())


def _most_told(descriptions: Iterable[T]) -> T | None:
    """What most nodes say (one description per node; a tie goes to the first told), or None."""
    told = Counter(descriptions)
    return max(told, key=told.__getitem__) if told else None


def _partitioned(
    group: str,
    nodes: Sequence[NodeFacts],
    allocations: Mapping[str, Sequence[events.AllocationEvent]],
) -> dict[str, Any]:
    """Each node's cards counted with that node's own profiles and partition count, so no node's
    figures size another node's cards; the profiles listed are every node's, each described as
    most of its nodes describe it."""
    remaining: Counter[str] = Counter()
    allocated: Counter[str] = Counter()
    described: dict[str, list[SliceProfile]] = {}
    capacity = free_instances = 0
    for node in nodes:
        ordered = _node_profiles(group, node)
        for p in ordered:
            described.setdefault(p.name, []).append(p)
        cards = [c for c in node.group_cards(group) if c.partition_count > 0]
        for card in cards:
            capacity += card.partition_count
            if card.unhealthy or card.mode not in ("None", "Partitioned"):
                continue
            free_instances += card.remaining * card.partition_count // UNITS
            if _slices_of(ordered):
                remaining.update(profiles_left(ordered, card.remaining))
        count = max((c.partition_count for c in cards), default=0)
        for event in allocations.get(node.name, ()):
            name = profile_of_tokens(ordered, len(event.device_ids), count)
            if name is not None:
                allocated[name] += 1
    listed = ordered_profiles(m for ps in described.values() if (m := _most_told(ps)))
    return {
        **_view(1 if any(remaining.values()) else 0, free_instances, capacity),
        "allocatedProfiles": [{"name": p.name, "count": allocated[p.name]} for p in listed],
        "remainingProfiles": [{"name": p.name, "count": remaining[p.name]} for p in listed],
    }


def told_group(
    group: str, nodes: Sequence[NodeFacts], describe: Callable[[DeviceGroup], Hashable]
) -> DeviceGroup | None:
    """A group of key ``group`` whose description (``describe``) most nodes give, each node
    telling once (its first such group); None when no node has one. A node describing its
    cards otherwise, truly or not, never rewrites what the others' say."""
    firsts = [
        first
        for node in nodes
        if (first := next((g for g in node.groups if product_key(g) == group), None))
    ]
    best = _most_told(describe(g) for g in firsts)
    return next((g for g in firsts if describe(g) == best), None)


def _detail(group: str, nodes: Sequence[NodeFacts]) -> dict[str, Any]:
    """The capability catalog: what one card of the group offers, as most nodes describe it."""
    told = told_group(group, nodes, lambda g: msgspec.json.encode(_card_detail(g)))
    return {} if told is None or not told.accelerators else _card_detail(told)


def _card_detail(first: DeviceGroup) -> dict[str, Any]:
    if not first.accelerators:
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


def _partitioned_on(
    group: str, node: NodeFacts, allocations: Iterable[events.AllocationEvent]
) -> list[events.AllocationEvent]:
    """The live partitioned allocations of ``node`` on its own cards of ``group``."""
    ids = {g.id for g in node.groups if product_key(g) == group}
    return [
        e
        for e in allocations
        if e.action == "allocated"
        and e.resource.endswith(".partitioned")
        and any(d.split(":", 1)[0] in ids for d in e.device_ids)
    ]


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
    partitioned = {n.name: _partitioned_on(group, n, allocations.get(n.name, ())) for n in nodes}
    four = {
        "accelerator": _exclusive(per_node),
        "acceleratorShared": _shared(per_node),
        "acceleratorSliced": _sliced(per_node),
        "acceleratorPartitioned": _partitioned(group, nodes, partitioned),
    }
    summary = " ".join(f"{v['onceMaxRequest']}/{v['remaining']}" for v in four.values())
    detail = {"slicedDetail": _detail(group, nodes)}
    return {**four, "detail": detail, "entrance": entrance, "summary": summary}

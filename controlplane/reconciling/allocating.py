"""``Devices.status`` from the spec and the device plugin's allocations: a pure ledger fold.

Every spec accelerator starts at mode ``None`` with ``remaining`` = one card (1,600,000 units).
Each live allocation (the latest ``allocated`` event per allocation id whose last word was not
``released``) charges the cards its device tokens name. Tokens are ``<group>:<accelerator>:<index>``
(the device plugin's format); the resource's suffix says the mode:

==================  ============  ==========================================================
resource            mode          units charged per token
==================  ============  ==========================================================
``<base>``          Exclusive     one card
``<base>.shared``   Shared        a tenth of a card (10 shares per card)
``<base>.sliced``   Sliced        one card / ``logicalSliced.count``; also ``allocatedSlices``
``<base>.partitioned`` Partitioned one card / ``physicalSliced.count``
==================  ============  ==========================================================

That table is the fallback for an agent that predates the event's ``charges``: an event that
carries them is charged exactly what the agent's ledger charged (a sliced container its own
``.sliced.units``, a partition its profile's), on the cards they name. A sliced allocation
counts one ``allocatedSlices`` on each card it holds (one container, one slice), and a
partitioned one with a ``profile`` counts one instance of it in ``allocatedProfiles``.

A card with partition profiles (MIG mode on) also lists ``remainingProfiles``: for every profile,
how many more instances of it alone would still fit (:func:`profiles_left`). The bus carries no
placement table, so the fit is counted in free compute slices; a card held whole, shared,
sliced or unhealthy fits none.

Visibility tokens and tokens naming an unknown accelerator charge nothing (the latter are
counted in :attr:`Status.unknown_tokens`). Charges are capped so ``remaining`` never goes below 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from bus import events
from bus.devices import Accelerator, DeviceGroup, SliceProfile
from controlplane.families import UNITS
from kit.tables import human_mib

__all__ = [
    "MODES",
    "UNITS",
    "Status",
    "devices_status",
    "mode_of",
    "ordered_profiles",
    "profiles_left",
    "units_by_card",
]

SHARES: Final = 10
MODES: Final = ("None", "Exclusive", "Shared", "Sliced", "Partitioned")
_RANK: Final = {
    m: i for i, m in enumerate(("None", "Shared", "Sliced", "Partitioned", "Exclusive"))
}


@dataclass
class _Card:
    accelerator: Accelerator
    mode: str = "None"
    allocated: int = 0
    slices: int = 0
    profiles: dict[str, int] = field(default_factory=dict)


@dataclass
class Status:
    """The computed ``status`` body and what could not be placed."""

    body: dict[str, Any]
    unknown_tokens: int = 0
    cards: dict[str, _Card] = field(default_factory=dict, repr=False)


def _mode_of(resource: str) -> str | None:
    suffix = resource.rpartition("/")[2]
    if "." not in suffix:
        return "Exclusive"
    return {"shared": "Shared", "sliced": "Sliced", "partitioned": "Partitioned"}.get(
        suffix.rpartition(".")[2]
    )


def _token_units(accelerator: Accelerator, mode: str) -> int:
    status = accelerator.status
    if mode == "Exclusive":
        return UNITS
    if mode == "Shared":
        return UNITS // SHARES
    if mode == "Sliced":
        count = status.logical_sliced.count if status.logical_sliced else 0
    else:
        count = status.physical_sliced.count if status.physical_sliced else 0
    return UNITS // count if count > 0 else UNITS


def ordered_profiles(profiles: Iterable[SliceProfile]) -> list[SliceProfile]:
    """Smallest first: the order profiles are listed in, in every status that counts them."""
    return sorted(profiles, key=lambda p: (p.compute_slices, p.memory_slices, p.name))


def profiles_left(profiles: Sequence[SliceProfile], remaining: int) -> dict[str, int]:
    """Per profile, the instances of it alone that fit in ``remaining`` units of one card.

    A card's units split into as many compute slices as its largest profile has; a profile
    fits as often as its slices go into the free ones, and never more than its own ``count``.
    """
    slices = max((p.compute_slices for p in profiles), default=0)
    free = max(0, remaining) * slices // UNITS if slices > 0 else 0
    return {p.name: min(p.count, free // max(p.compute_slices, 1)) for p in profiles}


def mode_of(event: events.AllocationEvent) -> str | None:
    """The ``Devices.status`` mode an allocation holds its cards in; None: it charges nothing."""
    return _mode_of(event.resource)


def units_by_card(
    accelerators: Mapping[str, Accelerator], event: events.AllocationEvent
) -> tuple[dict[str, int], int]:
    """What one allocation charges per known card, and how many of its tokens named none.

    The agent's own ``charges`` win over the token share (see the module docstring).
    """
    mode = _mode_of(event.resource)
    if mode is None:
        return {}, 0
    unknown = 0
    per_card: dict[str, int] = {}
    for token in event.device_ids:
        parts = token.split(":")
        accelerator = accelerators.get(parts[1]) if len(parts) == 3 else None
        if accelerator is None:
            unknown += 1
            continue
        per_card[accelerator.id] = per_card.get(accelerator.id, 0) + _token_units(accelerator, mode)
    if event.charges:
        per_card = {
            c.accelerator_id: min(UNITS, max(0, c.units))
            for c in event.charges
            if c.accelerator_id in accelerators
        }
    return per_card, unknown


def _fold(cards: Mapping[str, _Card], event: events.AllocationEvent, mode: str) -> int:
    """Charge one live allocation; the tokens that named no known card."""
    per_card, unknown = units_by_card({k: c.accelerator for k, c in cards.items()}, event)
    for card_id, units in per_card.items():
        card = cards[card_id]
        card.allocated = min(UNITS, card.allocated + units)
        if _RANK[mode] > _RANK[card.mode]:
            card.mode = mode
        if mode == "Sliced":
            card.slices += 1
        if mode == "Partitioned" and event.profile:
            card.profiles[event.profile] = card.profiles.get(event.profile, 0) + 1
    return unknown


def devices_status(
    groups: Iterable[DeviceGroup], allocations: Mapping[str, events.AllocationEvent]
) -> Status:
    """Build ``status.groups`` from the spec groups and the live allocations (pure)."""
    groups = list(groups)
    cards = {a.id: _Card(a) for g in groups for a in g.accelerators}
    unknown = 0
    for allocation_id in sorted(allocations):
        event = allocations[allocation_id]
        mode = _mode_of(event.resource)
        if event.action != "allocated" or mode is None:
            continue
        unknown += _fold(cards, event, mode)
    body = {
        "groups": [
            {
                "id": g.id,
                "manufacturer": g.manufacturer,
                "accelerators": [_card_body(cards[a.id]) for a in g.accelerators],
            }
            for g in groups
        ],
        "summary": _summary(groups, cards),
    }
    return Status(body=body, unknown_tokens=unknown, cards=cards)


def _summary(groups: list[DeviceGroup], cards: Mapping[str, _Card]) -> dict[str, Any]:
    """Counts for the printer columns (a count, not a list of UUIDs); memory in human units."""
    accels = [a for g in groups for a in g.accelerators]
    out: dict[str, Any] = {
        "accelerators": len(accels),
        "unhealthy": sum(a.status.unhealthy for a in accels),
        "allocated": sum(cards[a.id].allocated > 0 for a in accels),
    }
    if groups and groups[0].memory is not None:
        out["memory"] = human_mib(groups[0].memory)
    return out


def _remaining_profiles(card: _Card) -> dict[str, Any]:
    physical = card.accelerator.status.physical_sliced
    if physical is None or not physical.profiles:
        return {}
    profiles = ordered_profiles(physical.profiles)
    fits = not card.accelerator.status.unhealthy and card.mode in ("None", "Partitioned")
    left = profiles_left(profiles, UNITS - card.allocated) if fits else {}
    return {"remainingProfiles": [{"name": p.name, "count": left.get(p.name, 0)} for p in profiles]}


def _card_body(card: _Card) -> dict[str, Any]:
    return {
        "id": card.accelerator.id,
        "index": card.accelerator.index,
        "mode": card.mode,
        "allocated": card.allocated,
        "remaining": UNITS - card.allocated,
        "allocatedSlices": card.slices,
        **(
            {
                "allocatedProfiles": [
                    {"name": n, "count": c} for n, c in sorted(card.profiles.items())
                ]
            }
            if card.profiles
            else {}
        ),
        **_remaining_profiles(card),
    }

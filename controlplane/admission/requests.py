"""The request model: which of a container's resources are an accelerator claim, and their folds.

Per manufacturer base ``<base>`` (``nvidia.com/gpu``) a claim belongs to one of four families:

- exclusive ``<base>: N`` (whole cards) and shared ``<base>.shared: N`` (one share on each of N
  distinct cards of one node);
- sliced ``<base>.sliced: 1`` with one memory budget, ``.sliced.memory-percentage: P`` or
  ``.sliced.memory-mib: N``, and optionally ``.sliced.cores-percentage`` (default 100);
- partitioned ``<base>.partitioned: 1`` with one ``.partitioned.<kind>-<profile>: 1``.

Memory folds into units, :data:`UNITS` per card, so that a slice and a partition of the same
VRAM cost the same: ``P`` percent is ``P x 16,000``; ``N`` MiB is ``floor(N x UNITS / cardMiB)``;
a profile is its memory folded the same way. The MiB folds need the card's VRAM, which the Pod
names through the accelerator group its node selector or required affinity selects
(``acceleratable.feature.gpustack.ai/<group>: "true"``); the :class:`Catalog` answers for it.

The visibility resource (``device.gpustack.ai/<mfr>.visibility``) and anything else are not
claims: no family rule counts them. Messages follow Kubernetes' field errors (``<path>: Invalid
value: "<v>": <detail>``) because the API server shows them to the user as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, NamedTuple, Protocol

import msgspec

from controlplane.admission.pods import (
    Container,
    Pod,
    Slot,
    Term,
    container_slots,
    parse_quantity,
)
from controlplane.families import BASES, MANUFACTURER_OF, UNITS, Family, family_of
from controlplane.families import PREFIX as GROUP_PREFIX

__all__ = [
    "GROUP_PREFIX",
    "PERCENT_UNITS",
    "UNITS",
    "Card",
    "Catalog",
    "Claim",
    "Family",
    "Fold",
    "candidates",
    "claims_of",
    "family_of",
    "field",
    "forbidden",
    "group_manufacturer",
    "invalid",
    "mib_units",
    "named_groups",
    "percent_units",
    "read_int",
    "requests_of",
    "required",
    "selector_groups",
    "term_groups",
]

PERCENT_UNITS: Final = UNITS // 100
"""One percent of a card's memory: 16,000 units."""


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """One container's keys of one family of one base, with their values as written."""

    base: str
    family: Family
    values: dict[str, str | int]

    @property
    def manufacturer(self) -> str:
        return MANUFACTURER_OF[self.base]

    def key(self, suffix: str = "") -> str:
        """``key(".sliced.units")`` is ``nvidia.com/gpu.sliced.units``."""
        return f"{self.base}{suffix}"

    def profiles(self) -> list[tuple[str, str]]:
        """``(key, profile)`` of every ``<base>.partitioned.<kind>-<profile>`` key, sorted."""
        head = self.key(".partitioned.")
        suffixes = [k.removeprefix(head) for k in self.values if k.startswith(head)]
        return sorted((head + s, s.partition("-")[2] or s) for s in suffixes if s != "units")


class Card(msgspec.Struct, frozen=True, kw_only=True):
    """What admission knows of an accelerator group's cards."""

    group: str
    """The group's label key (``nvidia-h200``): ``acceleratable.feature.gpustack.ai/<group>``."""
    manufacturer: str
    memory_mib: int | None
    """The VRAM of one card, as the group's nodes agree on it; None when they do not (no
    strict majority, see :func:`controlplane.admission.cards.agreed`)."""
    profiles: Mapping[str, int] = {}
    """Partition profile name (``3g.40gb``) to its memory in MiB."""


class Catalog(Protocol):
    """The accelerator groups the cluster has (the worker answers from its ledger)."""

    def card(self, group: str) -> Card | None: ...

    def cards(self, manufacturer: str) -> Sequence[Card]: ...


class Fold(NamedTuple):
    """A claim's units, or why they cannot be computed (field-error messages)."""

    units: int | None
    errors: tuple[str, ...] = ()


def claims_of(container: Container) -> list[Claim]:
    """The container's claims, one per (base, family); limits win over requests for a key."""
    resources = container.resources
    if resources is None:
        return []
    values = {**(resources.requests or {}), **(resources.limits or {})}
    grouped: dict[tuple[str, Family], dict[str, str | int]] = {}
    for key, value in values.items():
        found = family_of(key)
        if found is not None:
            grouped.setdefault(found, {})[key] = value
    return [Claim(base=b, family=f, values=v) for (b, f), v in sorted(grouped.items())]


def requests_of(pod: Pod) -> list[tuple[Slot, list[Claim]]]:
    """Every container that claims an accelerator, with its claims."""
    return [(slot, found) for slot in container_slots(pod) if (found := claims_of(slot.container))]


def percent_units(percent: int) -> int:
    """``P`` percent of a card's memory: ``P x 16,000`` units (25 -> 400,000)."""
    return percent * PERCENT_UNITS


def mib_units(mib: int, card_mib: int) -> int:
    """``N`` MiB of a ``card_mib`` card: ``floor(N x 1,600,000 / card_mib)`` units."""
    return mib * UNITS // card_mib


def named_groups(pod: Pod) -> list[str]:
    """The accelerator groups the Pod's node selector or required affinity terms select."""
    keys = [k for k, v in (pod.spec.node_selector or {}).items() if v == "true"]
    found = _groups(keys)
    for term in pod.required_terms() or ():
        found += term_groups(term)
    return list(dict.fromkeys(found))


def selector_groups(pod: Pod) -> list[str]:
    """The groups the node selector names: every node the Pod may land on has one of them."""
    return _groups(k for k, v in (pod.spec.node_selector or {}).items() if v == "true")


def term_groups(term: Term) -> list[str]:
    """The groups one required term selects (``In [true]`` or ``Exists``)."""
    return _groups(
        r.key
        for r in term.match_expressions or ()
        if r.operator == "Exists" or (r.operator == "In" and "true" in (r.values or ()))
    )


def _groups(keys: Iterable[str]) -> list[str]:
    """Group keys among label keys: no dot (not ``.count``), not a manufacturer's own label."""
    names = (k.removeprefix(GROUP_PREFIX) for k in keys if k.startswith(GROUP_PREFIX))
    return [n for n in names if "." not in n and n not in BASES]


def group_manufacturer(group: str) -> str | None:
    """A group key always starts with its manufacturer (``nvidia-h200``, ``amd-radeon-…``)."""
    return next((m for m in BASES if group.startswith(f"{m}-")), None)


def candidates(claim: Claim, groups: Iterable[str], catalog: Catalog) -> list[Card]:
    """The cards a claim may land on: the named groups of its manufacturer, else all of them."""
    mfr = claim.manufacturer
    named = [c for g in groups if (c := catalog.card(g)) is not None and c.manufacturer == mfr]
    return named or list(catalog.cards(mfr))


def field(slot: Slot, key: str | None = None) -> str:
    """``spec.containers[0].resources.limits[nvidia.com/gpu.sliced]``."""
    where = f"{slot.path}.resources.limits"
    return f"{where}[{key}]" if key else where


def invalid(path: str, value: str | int, detail: str) -> str:
    return f'{path}: Invalid value: "{value}": {detail}'


def required(path: str, detail: str) -> str:
    return f"{path}: Required value: {detail}"


def forbidden(path: str, detail: str) -> str:
    return f"{path}: Forbidden: {detail}"


def read_int(slot: Slot, claim: Claim, key: str) -> tuple[int | None, tuple[str, ...]]:
    """The key's value as an integer; ``(None, ())`` when absent, an error when not whole."""
    raw = claim.values.get(key)
    if raw is None:
        return None, ()
    try:
        value = parse_quantity(raw)
    except ValueError:
        return None, (invalid(field(slot, key), raw, "must be a quantity"),)
    if value.denominator != 1:
        return None, (invalid(field(slot, key), raw, "must be an integer"),)
    return int(value), ()

"""Which device-plugin servers a node has, and the tokens each advertises to kubelet.

A pure function of the detected groups, the ``--no-*`` switches and the ledger's card modes.
Invariants:

- one server per (manufacturer, mode); exclusive and visibility always exist for a detected
  manufacturer, the others unless switched off (partitioned only where the vendor partitions);
- a token id is ``<group>:<accelerator id>:<index>`` with a 4-digit index, at most 63 characters
  (a long accelerator id is shortened with a hash of itself, so the id is still deterministic);
- a token is Unhealthy when its card is, or (except visibility) when the ledger holds the card in
  another mode, so kubelet does not offer it;
- cards a container holds are kept (Unhealthy) when detection stops reporting them, so kubelet's
  checkpoints never point at a vanished token.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from agent.devices.manufacturers import MANUFACTURERS
from bus import devices

Mode = Literal["exclusive", "shared", "sliced", "partitioned", "visibility"]
MODES: Final[tuple[Mode, ...]] = ("exclusive", "shared", "sliced", "partitioned", "visibility")

UNITS_PER_CARD: Final = 1_600_000
SHARED_TOKENS: Final = 10
VISIBILITY_TOKENS: Final = 512
MAX_ID_LENGTH: Final = 63
PARTITIONING_VENDORS: Final = frozenset({"nvidia", "hygon", "thead"})
"""Manufacturers with a hardware partition kind (``mig``: NVIDIA, Hygon DMI-MIG, T-Head)."""

HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

_ID = re.compile(r"^[^:\s]+:[^:\s]+:[0-9]{4,}$")


@dataclass(frozen=True)
class Card:
    """What allocation and injection need to know about one accelerator."""

    id: str
    group: str
    manufacturer: str
    index: int
    physical_indexes: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    unhealthy: bool
    memory_mib: int | None
    runtime_version: str | None
    sliced_count: int
    """``logicalSliced.count``; 0 when the card cannot be sliced."""
    partition_count: int
    """``physicalSliced.count``; 0 when the card is not in partition mode."""
    compute_units: int | None = None
    """The group's ``cores`` (AMD: compute units, which sliced ``HSA_CU_MASK`` divides)."""
    family: str | None = None
    """The group's ``family`` (Ascend: the CANN variant its slicing runtime is built for)."""
    pci_bus_id: str | None = None
    """``topology.pciBusId`` (MetaX: the sysfs directory its slices are made under)."""


@dataclass(frozen=True)
class Token:
    """One device id kubelet can hand out, and the card behind it."""

    id: str
    card: str
    index: int
    numa_nodes: tuple[int, ...]
    healthy: bool


@dataclass(frozen=True)
class ServerSpec:
    """Everything one resource server advertises."""

    manufacturer: str
    mode: Mode
    resource: str
    socket_name: str
    tokens: tuple[Token, ...]

    @property
    def key(self) -> tuple[str, Mode]:
        return (self.manufacturer, self.mode)


def resource_name(manufacturer: str, mode: Mode) -> str:
    """``nvidia.com/gpu`` (exclusive), ``nvidia.com/gpu.<mode>``, or the visibility resource."""
    if mode == "visibility":
        return f"device.gpustack.ai/{manufacturer}.visibility"
    base = MANUFACTURERS[manufacturer].resource
    return base if mode == "exclusive" else f"{base}.{mode}"


def socket_name(manufacturer: str, mode: Mode) -> str:
    return f"{manufacturer}.{mode}.sock"


def device_id(group: str, accelerator: str, index: int) -> str:
    """The token id; shortened deterministically when a long id would pass 63 characters."""
    suffix = f"{index:04d}"
    full = f"{group}:{accelerator}:{suffix}"
    if len(full) <= MAX_ID_LENGTH:
        return full
    digest = hashlib.sha256(f"{group}:{accelerator}".encode()).hexdigest()[:10]
    room = MAX_ID_LENGTH - len(suffix) - 2  # two colons
    group_part = group[: max(8, room // 3)] if len(group) + 12 > room else group
    keep = max(0, room - len(group_part) - len(digest) - 1)
    return f"{group_part}:{accelerator[:keep]}~{digest}:{suffix}"


def is_well_formed(token_id: str) -> bool:
    return len(token_id) <= MAX_ID_LENGTH and _ID.match(token_id) is not None


def numa_nodes(affinity: str | None) -> tuple[int, ...]:
    """Parse a node list such as ``0``, ``0-1`` or ``0,2``; garbage yields no nodes."""
    nodes: list[int] = []
    for part in (affinity or "").split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return ()
        nodes.extend(range(int(first), int(last or first) + 1))
    return tuple(sorted(set(nodes)))


def cards_of(groups: Iterable[devices.DeviceGroup]) -> dict[str, Card]:
    """Every accelerator of ``groups`` whose manufacturer we know, keyed by accelerator id."""
    cards: dict[str, Card] = {}
    for group in groups:
        if group.manufacturer not in MANUFACTURERS:
            continue
        for acc in group.accelerators:
            cards[acc.id] = _card(group, acc)
    return cards


def _card(group: devices.DeviceGroup, acc: devices.Accelerator) -> Card:
    status = acc.status
    return Card(
        id=acc.id,
        group=group.id,
        manufacturer=group.manufacturer,
        index=acc.index,
        physical_indexes=acc.physical_indexes or (),
        numa_nodes=numa_nodes(acc.topology.numa_affinity if acc.topology else None),
        unhealthy=status.unhealthy,
        memory_mib=group.memory,
        runtime_version=group.runtime_version,
        sliced_count=status.logical_sliced.count if status.logical_sliced else 0,
        partition_count=status.physical_sliced.count if status.physical_sliced else 0,
        compute_units=group.cores,
        family=group.family,
        pci_bus_id=acc.topology.pci_bus_id if acc.topology else None,
    )


def keep_held(
    new: Mapping[str, Card], old: Mapping[str, Card], held: Iterable[str]
) -> dict[str, Card]:
    """``new`` plus every held card detection no longer reports, kept but marked unhealthy."""
    cards = dict(new)
    for card_id in held:
        if card_id not in cards and card_id in old:
            gone = old[card_id]
            cards[card_id] = Card(**{**gone.__dict__, "unhealthy": True})
    return cards


def modes_for(
    manufacturer: str, *, no_shared: bool, no_sliced: bool, no_partitioned: bool
) -> list[Mode]:
    modes: list[Mode] = ["exclusive"]
    if not no_shared:
        modes.append("shared")
    if not no_sliced:
        modes.append("sliced")
    if not no_partitioned and manufacturer in PARTITIONING_VENDORS:
        modes.append("partitioned")
    modes.append("visibility")
    return modes


def plan_servers(
    cards: Mapping[str, Card],
    *,
    held_modes: Mapping[str, Mode],
    no_shared: bool = False,
    no_sliced: bool = False,
    no_partitioned: bool = False,
) -> dict[tuple[str, Mode], ServerSpec]:
    """The servers ``cards`` call for, keyed by (manufacturer, mode), with their tokens."""
    ordered = sorted(cards.values(), key=lambda c: (c.manufacturer, c.index, c.id))
    specs: dict[tuple[str, Mode], ServerSpec] = {}
    for manufacturer in sorted({c.manufacturer for c in ordered}):
        mine = [c for c in ordered if c.manufacturer == manufacturer]
        switches = {
            "no_shared": no_shared,
            "no_sliced": no_sliced,
            "no_partitioned": no_partitioned,
        }
        for mode in modes_for(manufacturer, **switches):
            tokens = tuple(t for c in mine for t in _tokens(c, mode, _blocked(c, mode, held_modes)))
            specs[(manufacturer, mode)] = ServerSpec(
                manufacturer=manufacturer,
                mode=mode,
                resource=resource_name(manufacturer, mode),
                socket_name=socket_name(manufacturer, mode),
                tokens=tokens,
            )
    return specs


def token_count(card: Card, mode: Mode) -> int:
    """How many tokens ``card`` advertises in ``mode`` (0: the card does not take part)."""
    partitioned = card.partition_count > 0
    if mode == "visibility":
        return VISIBILITY_TOKENS
    if mode == "partitioned":
        return card.partition_count
    if partitioned:
        return 0  # a card in partition mode is never handed out whole
    if mode == "exclusive":
        return 1
    if mode == "shared":
        return SHARED_TOKENS
    return card.sliced_count


def _blocked(card: Card, mode: Mode, held_modes: Mapping[str, Mode]) -> bool:
    """Whether the ledger holds ``card`` in a mode other than ``mode`` (visibility never is)."""
    held_in = held_modes.get(card.id)
    return held_in is not None and held_in != mode and mode != "visibility"


@functools.lru_cache(maxsize=1024)
def _tokens(card: Card, mode: Mode, blocked: bool) -> tuple[Token, ...]:
    """A card's tokens in one mode, cached: a new holding re-plans every server, yet changes
    only the blocked flag of one card's tokens in the other modes, so every other tuple (the
    512 visibility tokens of each card above all) comes back as the same object, and
    comparing it with the advertised one costs an identity check per token."""
    healthy = not card.unhealthy and not blocked
    return tuple(
        Token(
            id=device_id(card.group, card.id, index),
            card=card.id,
            index=index,
            numa_nodes=() if mode == "partitioned" else card.numa_nodes,
            healthy=healthy,
        )
        for index in range(token_count(card, mode))
    )


def units_per_token(card: Card, mode: Mode) -> int:
    """What one token of ``mode`` charges on ``card``: a container's share is its token count.

    Exclusive charges the whole card, shared a tenth, sliced ``1/logicalSliced.count`` and
    partitioned ``1/physicalSliced.count`` per token; visibility charges nothing.
    """
    if mode == "exclusive":
        return UNITS_PER_CARD
    if mode == "shared":
        return UNITS_PER_CARD // SHARED_TOKENS
    if mode == "visibility":
        return 0
    count = token_count(card, mode)
    return UNITS_PER_CARD // count if count else UNITS_PER_CARD

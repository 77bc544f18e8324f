"""What NVIDIA cards are, derived from what NVML said: pure functions, no NVML calls.

The backend (:mod:`agent.devices.nvidia`) reads a :class:`CardFacts` per card; everything here
turns facts into wire shapes (SM counts from CUDA cores, CUDA ``major.minor`` from NVML's integer,
architecture names, MIG slice profiles, groups), so each derivation is tested without a driver.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

from agent.devices.libs.nvml import GpuInstanceProfile
from agent.devices.manufacturers import MANUFACTURERS
from bus import devices

T = TypeVar("T")

MANUFACTURER = "nvidia"
UNKNOWN_NAME = "NVIDIA GPU"
"""The group name of cards whose product name NVML would not give."""

_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
"""NVML ``nvmlDeviceArchitecture_t`` values."""

_RESOURCE_SEGMENT = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


# -- pure derivations ---------------------------------------------------------------------------


def cores_per_sm(capability: tuple[int, int]) -> int | None:
    """FP32 CUDA cores per streaming multiprocessor, by compute capability (CUDA guide table)."""
    major, minor = capability
    if major == 3:
        return 192
    if major == 5 or (major == 6 and minor != 0):
        return 128
    if major in (6, 7) or capability == (8, 0):
        return 64
    if major >= 8:
        return 128
    return None


def streaming_multiprocessors(
    cuda_cores: int | None, capability: tuple[int, int] | None
) -> int | None:
    """SM count from CUDA cores; None when the table does not divide the count exactly."""
    if cuda_cores is None or capability is None:
        return None
    per_sm = cores_per_sm(capability)
    if not per_sm or cuda_cores % per_sm:
        return None
    return cuda_cores // per_sm


def runtime_version(cuda_driver_version: int) -> str:
    """``12080`` → ``12.8``: NVML encodes ``major*1000 + minor*10``."""
    return f"{cuda_driver_version // 1000}.{cuda_driver_version % 1000 // 10}"


def family_from_architecture(architecture: int | None) -> str | None:
    return _ARCHITECTURES.get(architecture) if architecture is not None else None


def family_from_capability(capability: tuple[int, int] | None) -> str | None:
    """The architecture a compute capability belongs to (7.5 splits Turing from Volta)."""
    if capability is None:
        return None
    major, minor = capability
    by_major = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 9: "Hopper"}
    if major in by_major:
        return by_major[major]
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    if major == 8:
        return "Ada Lovelace" if minor == 9 else "Ampere"
    if major in (10, 11, 12):
        return "Blackwell"
    return None


def slice_profiles(profiles: tuple[GpuInstanceProfile, ...]) -> tuple[devices.SliceProfile, ...]:
    """MIG profiles a pod can ask for: a valid resource-name segment and a legal placement.

    ``1g.10gb+me`` fails the first test; a profile NVML lists with no placement fails the second.
    """
    return tuple(
        devices.SliceProfile(
            name=p.name,
            memory_mib=p.memory_mib,
            compute_slices=p.slice_count,
            memory_slices=p.placements[0][1],
            count=p.instance_count,
        )
        for p in profiles
        if _RESOURCE_SEGMENT.match(p.name) and p.placements
    )


def pct(part: int, whole: int) -> int | None:
    """``part`` as an integer percent of ``whole``, rounded half up; None when ``whole`` is 0."""
    return (200 * part + whole) // (2 * whole) if whole > 0 else None


# -- what one pass reads of one card ------------------------------------------------------------


@dataclass
class CardFacts:
    """What NVML and sysfs said about one card this pass; None where nothing was learnt.

    Filled field by field in NVML call order, so a lost card keeps exactly what came before.
    """

    index: int
    uuid: str
    lost: bool = False
    bus_id: str | None = None
    minor: int | None = None
    name: str | None = None
    memory_bytes: int | None = None
    cuda_cores: int | None = None
    capability: tuple[int, int] | None = None
    architecture: int | None = None
    mig_mode: bool | None = None
    mig_profiles: tuple[GpuInstanceProfile, ...] | None = None
    bridges: tuple[str, ...] = ()
    numa: str | None = None
    cpus: str | None = None


def accelerator(card: CardFacts) -> devices.Accelerator:
    return devices.Accelerator(
        id=card.uuid,
        index=card.index,
        physical_indexes=(card.minor,) if card.minor is not None else None,
        topology=topology(card),
        status=status(card),
    )


def topology(card: CardFacts) -> devices.Topology | None:
    """Where the card sits; ``pciSwitches`` lists the bridges innermost first."""
    if not (card.bus_id or card.bridges or card.numa or card.cpus):
        return None
    return devices.Topology(
        pci_bus_id=card.bus_id,
        pci_root_id=card.bridges[0] if card.bridges else None,
        pci_switches=tuple(reversed(card.bridges)) or None,
        numa_affinity=card.numa,
        cpu_affinity=card.cpus,
    )


def status(card: CardFacts) -> devices.AcceleratorStatus:
    """Health and slicing. A card in MIG mode offers partitions and no software slices.

    A card whose MIG mode is unknown (not supported, or lost before it was read) is taken as not
    partitioned, so a lost card keeps its slice pool, marked unhealthy, instead of vanishing.
    """
    if card.mig_mode:
        profiles = slice_profiles(card.mig_profiles or ())
        physical = (
            devices.PhysicalSliced(profiles=profiles, count=max(p.count for p in profiles))
            if profiles
            else None
        )
        return devices.AcceleratorStatus(unhealthy=card.lost, physical_sliced=physical)
    nvidia = MANUFACTURERS[MANUFACTURER]
    logical = devices.LogicalSliced(
        cores_percentage_overcommit=nvidia.cores_overcommit, count=nvidia.logical_slices
    )
    return devices.AcceleratorStatus(unhealthy=card.lost, logical_sliced=logical)


def build_groups(
    cards: list[CardFacts],
    *,
    driver_version: str | None,
    cuda_driver_version: int | None,
    simulated: bool,
) -> list[devices.DeviceGroup]:
    """One group per product and memory size, ids made unique by a ``-<GiB>g`` suffix.

    A card whose memory was not read joins its product's group when there is exactly one, so a
    card lost mid-read does not rename its healthy siblings' group.
    """
    members: dict[tuple[str, int | None], list[CardFacts]] = {}
    for card in cards:
        members.setdefault(_group_key(card, cards), []).append(card)
    final_ids = devices.disambiguated_ids(
        (devices.group_id(MANUFACTURER, name), memory) for name, memory in members
    )
    groups = []
    for (name, memory), group_cards in members.items():
        gid = final_ids[(devices.group_id(MANUFACTURER, name), memory)]
        groups.append(
            _group(gid, name, group_cards, driver_version, cuda_driver_version, simulated)
        )
    return groups


def _group_key(card: CardFacts, cards: list[CardFacts]) -> tuple[str, int | None]:
    name = card.name or UNKNOWN_NAME
    memory = card.memory_bytes >> 20 if card.memory_bytes is not None else None
    if memory is None:
        siblings = [c for c in cards if (c.name or UNKNOWN_NAME) == name]
        known = {c.memory_bytes >> 20 for c in siblings if c.memory_bytes is not None}
        if len(known) == 1:
            memory = known.pop()
    return name, memory


def _group(
    gid: str,
    name: str,
    cards: list[CardFacts],
    driver_version: str | None,
    cuda_driver_version: int | None,
    simulated: bool,
) -> devices.DeviceGroup:
    """Group-level figures come from the first card that reported each."""
    capability = _first(c.capability for c in cards)
    memory = _first(c.memory_bytes for c in cards)
    family = _first(family_from_architecture(c.architecture) for c in cards)
    return devices.DeviceGroup(
        id=gid,
        manufacturer=MANUFACTURER,
        name=name,
        memory=memory >> 20 if memory is not None else None,
        cores=_first(streaming_multiprocessors(c.cuda_cores, c.capability) for c in cards),
        driver_version=driver_version,
        runtime_version=runtime_version(cuda_driver_version) if cuda_driver_version else None,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        family=family or family_from_capability(capability),
        simulated=simulated,
        accelerators=tuple(accelerator(c) for c in cards),
    )


def _first(values: Iterator[T | None]) -> T | None:
    return next((v for v in values if v is not None), None)

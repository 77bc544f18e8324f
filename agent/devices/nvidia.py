"""NVIDIA detection and sampling: the PCI check, then NVML, one session per pass.

How failures are contained (one card never takes the others down):

- a field NVML does not offer (:class:`~agent.devices.nvml.NvmlUnsupported`) is left out;
- any other failure of an optional call costs that field and logs a WARNING;
- a card that answers ``GPU_IS_LOST`` is not asked anything more this pass; it is reported
  ``unhealthy`` with what was read before the loss, if its UUID was read (or an earlier pass of
  this backend read it), and left out with a WARNING otherwise;
- a card whose handle or UUID cannot be read is left out with a WARNING;
- only NVML as a whole failing (init with cards on the bus, the driver version, the device
  count) raises :class:`DetectionError`, because then no card can be trusted.

Unit conversions truncate, as the reference does: bytes ``>> 20`` to MiB, mW ``// 1000`` to W, so
a reported figure never exceeds what was measured. Percentages are rounded half up.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import TypeVar

from agent.devices import pci
from agent.devices.hostfs import HostFS
from agent.devices.manufacturers import MANUFACTURERS
from agent.devices.nvml import (
    GpuInstanceProfile,
    Handle,
    Nvml,
    NvmlError,
    NvmlGpuLost,
    NvmlUnavailable,
    NvmlUnsupported,
)
from agent.errors import DetectionError
from bus import devices

log = logging.getLogger(__name__)

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
    base_ids = [devices.group_id(MANUFACTURER, name) for name, _ in members]
    groups = []
    for (name, memory), group_cards in members.items():
        gid = devices.group_id(MANUFACTURER, name)
        if base_ids.count(gid) > 1 and memory is not None:
            gid = f"{gid}-{(memory + 512) // 1024}g"  # GiB, rounded half up
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


# -- the backend --------------------------------------------------------------------------------


class _CardReader:
    """Reads optional values of one card, and stops asking once the card is lost."""

    def __init__(self, handle: Handle, label: str) -> None:
        self.handle = handle
        self.label = label
        self.lost = False

    def get(self, call: Callable[[Handle], T]) -> T | None:
        if self.lost:
            return None
        try:
            return call(self.handle)
        except NvmlUnsupported:
            return None
        except NvmlGpuLost as e:
            self.lost = True
            log.warning("NVIDIA %s is lost (%s); reporting it unhealthy", self.label, e)
        except NvmlError as e:  # any other failure, a driver unloading mid-pass included
            log.warning("NVIDIA %s: %s; leaving the field out", self.label, e)
        return None


class NvidiaBackend:
    """:class:`agent.devices.detection.Backend` for NVIDIA, over NVML (real or simulated)."""

    manufacturer = MANUFACTURER

    def __init__(
        self, *, host: HostFS, nvml: Nvml, pci_check: bool = True, simulated: bool = False
    ) -> None:
        self.host = host
        self.nvml = nvml
        self.pci_check = pci_check
        self.simulated = simulated
        self._last_seen: dict[int, CardFacts] = {}
        """Each NVML index's card as last read, to report it unhealthy if it is lost unread."""

    def detect(self) -> list[devices.DeviceGroup]:
        return self._pass(self._detect) or []

    def sample(self) -> list[devices.AcceleratorSample]:
        return self._pass(self._sample) or []

    # -- one pass -----------------------------------------------------------------------------

    def _pass(self, body: Callable[[dict[str, pci.PciFunction]], list[T]]) -> list[T] | None:
        """PCI check, then one NVML session around ``body``; None when there is nothing here."""
        functions: dict[str, pci.PciFunction] = {}
        if self.pci_check:
            functions = {f.bdf: f for f in pci.scan(self.host, MANUFACTURERS["nvidia"].pci_vendor)}
            if not functions:
                log.debug("no NVIDIA PCI device; NVML not loaded")
                return None
        with ExitStack() as stack:
            try:
                stack.enter_context(self.nvml.session())
            except NvmlError as e:
                self._init_failed(len(functions), e)
                return None
            return body(functions)

    def _init_failed(self, found: int, e: NvmlError) -> None:
        """Raise unless NVML is simply absent and no card on the bus says it should be here."""
        if found:
            plural = "device" if found == 1 else "devices"
            message = f"{found} NVIDIA PCI {plural} found but NVML failed to initialise: {e.detail}"
            raise DetectionError(MANUFACTURER, message) from e
        if isinstance(e, NvmlUnavailable):
            log.info("NVML is not available (%s); no NVIDIA accelerator detected", e.detail)
            return
        raise DetectionError(MANUFACTURER, f"NVML failed to initialise: {e.detail}") from e

    def _system(self, call: Callable[[], T], *, optional: bool) -> T | None:
        """A host-wide NVML value; only an optional one may be unsupported, all else is fatal."""
        try:
            return call()
        except NvmlError as e:
            if optional and isinstance(e, NvmlUnsupported):
                return None
            raise DetectionError(MANUFACTURER, f"NVML {e}") from e

    def _detect(self, functions: dict[str, pci.PciFunction]) -> list[devices.DeviceGroup]:
        driver = self._system(self.nvml.driver_version, optional=True)
        cuda = self._system(self.nvml.cuda_driver_version, optional=True)
        count = self._system(self.nvml.device_count, optional=False) or 0
        cards = [c for i in range(count) if (c := self._read_card(i, functions)) is not None]
        return build_groups(
            cards, driver_version=driver, cuda_driver_version=cuda, simulated=self.simulated
        )

    # -- one card -----------------------------------------------------------------------------

    def _identify(self, index: int) -> tuple[Handle, str] | CardFacts | None:
        """The card's handle and UUID; else what an earlier pass knew if it is lost, else None."""
        try:
            handle = self.nvml.handle(index)
            return handle, self.nvml.uuid(handle)
        except NvmlError as e:
            known = self._last_seen.get(index)
            if isinstance(e, NvmlGpuLost) and known is not None:
                log.warning("NVIDIA card %d (%s) is lost (%s); reporting it unhealthy",
                            index, known.uuid, e)  # fmt: skip
                return replace(known, lost=True)
            log.warning("NVIDIA card %d cannot be identified (%s); leaving it out", index, e)
            return None

    def _read_card(self, index: int, functions: dict[str, pci.PciFunction]) -> CardFacts | None:
        identified = self._identify(index)
        if not isinstance(identified, tuple):
            return identified
        handle, uuid = identified
        card = CardFacts(index=index, uuid=uuid)
        reader = _CardReader(handle, f"card {index} ({uuid})")
        card.bus_id = reader.get(self.nvml.pci_bus_id)
        if card.bus_id:
            reader.label = f"card {index} ({uuid}, {card.bus_id})"
        card.minor = reader.get(self.nvml.minor_number)
        card.name = reader.get(self.nvml.name)
        memory = reader.get(self.nvml.memory)
        card.memory_bytes = memory[0] if memory else None
        card.cuda_cores = reader.get(self.nvml.num_cores)
        card.capability = reader.get(self.nvml.compute_capability)
        card.architecture = reader.get(self.nvml.architecture)
        card.mig_mode = reader.get(self.nvml.mig_mode)
        if card.mig_mode:
            card.mig_profiles = reader.get(self.nvml.gpu_instance_profiles)
        self._read_locality(card, reader, functions)
        card.lost = reader.lost
        if not card.lost:
            self._last_seen[index] = card
        return card

    def _read_locality(
        self, card: CardFacts, reader: _CardReader, functions: dict[str, pci.PciFunction]
    ) -> None:
        """Bridges, NUMA node and CPUs from sysfs; NVML's affinity masks where sysfs is silent."""
        function = None
        if card.bus_id:
            function = functions.get(card.bus_id) or pci.read_function(self.host, card.bus_id)
        if function is not None:
            card.bridges = function.bridges
            card.numa = str(function.numa_node) if function.numa_node is not None else None
            card.cpus = function.cpu_list
        if card.numa is None:
            nodes = reader.get(self.nvml.memory_affinity)
            card.numa = pci.format_cpu_list(nodes) if nodes else None
        if card.cpus is None:
            cpus = reader.get(self.nvml.cpu_affinity)
            card.cpus = pci.format_cpu_list(cpus) if cpus else None

    # -- sampling -----------------------------------------------------------------------------

    def _sample(self, _functions: dict[str, pci.PciFunction]) -> list[devices.AcceleratorSample]:
        count = self._system(self.nvml.device_count, optional=False) or 0
        return [s for i in range(count) if (s := self._sample_card(i)) is not None]

    def _sample_card(self, index: int) -> devices.AcceleratorSample | None:
        identified = self._identify(index)
        if not isinstance(identified, tuple):
            return (
                devices.AcceleratorSample(id=identified.uuid, unhealthy=True)
                if identified
                else None
            )
        handle, uuid = identified
        known = self._last_seen.get(index)
        if known is None or known.uuid != uuid:
            self._last_seen[index] = CardFacts(index=index, uuid=uuid)
        reader = _CardReader(handle, f"card {index} ({uuid})")
        memory = reader.get(self.nvml.memory)
        utilization = reader.get(self.nvml.utilization)
        temperature = reader.get(self.nvml.temperature)
        power_mw = reader.get(self.nvml.power_usage)
        total, used = memory if memory else (None, None)
        return devices.AcceleratorSample(
            id=uuid,
            memory=total >> 20 if total is not None else None,
            memory_usage=used >> 20 if used is not None else None,
            memory_utilization=pct(used, total) if total is not None and used is not None else None,
            cores_utilization=utilization,
            temperature=temperature,
            power_usage=power_mw // 1000 if power_mw is not None else None,
            unhealthy=reader.lost,
        )

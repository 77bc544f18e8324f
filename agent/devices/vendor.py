"""Detection and sampling for the seven manufacturers read through a vendor library.

Ascend, Cambricon, Hygon, Iluvatar, MetaX, Moore Threads and T-Head share one backend,
:class:`VendorBackend`; what differs is a :class:`Reader` (one module per manufacturer) over an
adapter of its management library (one ctypes module per library). A pass goes:

1. the PCI check: one scan of ``/sys/bus/pci/devices`` shared by the seven backends
   (:class:`PciCensus`); a manufacturer without an accelerator-class function is skipped before
   its Python adapter is imported or its library is opened, so a node without those cards pays
   one directory scan for all seven;
2. the library is opened (once per backend) and initialised for this pass;
3. each card is identified (index, UUID) and described; failures are contained as for NVIDIA:
   an unsupported value costs its field, a lost card stops being asked and is reported
   ``unhealthy`` with what was read (or with what an earlier pass read), a card that cannot be
   identified is left out with a WARNING, and only the library as a whole failing raises
   :class:`DetectionError`.

Library missing: with cards on the bus that is a :class:`DetectionError` naming the paths tried
(one stderr line from ``dm detect``); with no PCI check and no cards it is an INFO line.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from agent.devices import pci
from agent.devices.hostfs import HostFS
from agent.devices.libs import clib
from agent.devices.manufacturers import MANUFACTURERS
from agent.errors import DetectionError
from bus import devices

log = logging.getLogger(__name__)

T = TypeVar("T")

PER_DECISION = 5
"""The launcher's ``-v=3`` level: a line every pass per manufacturer, too chatty for ``-v=2``."""

READERS: dict[str, str] = {
    "ascend": "agent.devices.ascend",
    "cambricon": "agent.devices.cambricon",
    "hygon": "agent.devices.hygon",
    "iluvatar": "agent.devices.iluvatar",
    "metax": "agent.devices.metax",
    "mthreads": "agent.devices.mthreads",
    "thead": "agent.devices.thead",
}
"""Manufacturer → the module holding its ``reader(library, host)`` factory, imported on demand."""


# -- what a reader reports ----------------------------------------------------------------------


@dataclass
class Card:
    """What one pass read of one card; None where nothing was learnt.

    Filled in call order, so a card lost mid-read keeps exactly what came before the loss.
    """

    index: int
    uuid: str
    lost: bool = False
    name: str | None = None
    bus_id: str | None = None
    """Lowercase ``dddd:bb:dd.f``; joins the card to its sysfs entry for locality."""
    physical_indexes: tuple[int, ...] | None = None
    memory_mib: int | None = None
    cores: int | None = None
    compute_capability: str | None = None
    family: str | None = None
    driver_version: str | None = None
    """Set only where the library reports it per card (MetaX, Cambricon)."""
    numa: str | None = None
    """From the library, used only where sysfs has no NUMA node for the card."""
    physical_sliced: devices.PhysicalSliced | None = None
    """Hardware partitioning, when the card is in partition mode."""


@dataclass
class Usage:
    """One card's usage now, in the wire's units (MiB, %, °C, W); None where unread."""

    memory_mib: int | None = None
    memory_used_mib: int | None = None
    cores_utilization: int | None = None
    temperature: int | None = None
    power_w: int | None = None


class Get(Protocol):
    """Reads one optional value: an unsupported call, a lost card or a failure yields None."""

    def __call__(self, call: Callable[..., T], *args: Any) -> T | None: ...


class Reader(Protocol):
    """One manufacturer's reading of its library; the backend owns containment and shaping.

    ``session``, ``versions`` and ``slots`` raise :class:`clib.LibError` for the manufacturer as
    a whole; ``identify`` raises it for one card; ``describe`` and ``measure`` read optional
    values through ``get`` only, so they never raise for one card's trouble.
    """

    manufacturer: str
    library: str
    """How the library is named in messages: ``DCMI (libdcmi.so)``."""

    def session(self) -> AbstractContextManager[object]: ...

    def versions(self) -> tuple[str | None, str | None]:
        """Host-wide ``(driver, runtime)`` versions, ``major.minor`` for the runtime."""
        ...

    def slots(self) -> Sequence[Any]:
        """The cards to read this pass, in detection order (position = ``index``)."""
        ...

    def identify(self, slot: Any) -> tuple[Any, str]:
        """``(handle, uuid)`` of one card."""
        ...

    def describe(self, handle: Any, card: Card, get: Get) -> None: ...

    def measure(self, handle: Any, get: Get) -> Usage: ...

    def release(self, handle: Any) -> None:
        """Free a handle ``identify`` made (MTML's device objects); a no-op for most."""
        ...


# -- the PCI census -----------------------------------------------------------------------------


class PciCensus:
    """One PCI scan serving every vendor backend of a pass.

    The first backend to ask scans for all vendors at once; each vendor's answer is handed out
    once, so the next pass scans afresh. An answer older than ``max_age_s`` is never handed out
    (a backend skipped in one pass must not see that pass's tree later).
    """

    def __init__(self, host: HostFS, vendors: set[int], max_age_s: float = 2.0) -> None:
        self.host = host
        self.vendors = vendors
        self.max_age_s = max_age_s
        self.scans = 0
        self._fresh: dict[int, list[pci.PciFunction]] = {}
        self._taken_at = 0.0
        self._lock = threading.Lock()

    def functions(self, vendor: int) -> list[pci.PciFunction]:
        with self._lock:
            stale = time.monotonic() - self._taken_at > self.max_age_s
            if stale or vendor not in self._fresh:
                found = pci.scan_vendors(self.host, self.vendors | {vendor})
                self._fresh = {v: found.get(v, []) for v in self.vendors | {vendor}}
                self._taken_at = time.monotonic()
                self.scans += 1
            return self._fresh.pop(vendor)


# -- the backend --------------------------------------------------------------------------------


class _CardGet:
    """:class:`Get` for one card: stops asking once the card is lost."""

    def __init__(self, manufacturer: str, label: str) -> None:
        self.manufacturer = manufacturer
        self.label = label
        self.lost = False

    def __call__(self, call: Callable[..., T], *args: Any) -> T | None:
        if self.lost:
            return None
        try:
            return call(*args)
        except clib.LibUnsupported:
            return None
        except clib.LibLost as e:
            self.lost = True
            log.warning("%s %s is lost (%s); reporting it unhealthy", self.manufacturer,
                        self.label, e)  # fmt: skip
        except clib.LibError as e:
            log.warning("%s %s: %s; leaving the field out", self.manufacturer, self.label, e)
        return None


class VendorBackend:
    """:class:`agent.devices.detection.Backend` for one of the seven library-read manufacturers.

    ``library`` makes the library object (a simulator) when given; otherwise the reader module
    loads the real library on first need. Either way nothing is imported or opened before the
    PCI check finds a card (or the check is off).
    """

    def __init__(
        self,
        manufacturer: str,
        *,
        host: HostFS,
        census: PciCensus,
        library: Callable[[], Any] | None = None,
        pci_check: bool = True,
        simulated: bool = False,
    ) -> None:
        self.manufacturer = manufacturer
        self.host = host
        self.census = census
        self.pci_check = pci_check
        self.simulated = simulated
        self._make_library = library
        self._reader: Reader | None = None
        self._last_seen: dict[int, Card] = {}
        self._lock = threading.Lock()
        """One pass at a time: a reader keeps per-pass state (MTML's library handle)."""

    def detect(self) -> list[devices.DeviceGroup]:
        return self._pass(self._detect) or []

    def sample(self) -> list[devices.AcceleratorSample]:
        return self._pass(self._sample) or []

    # -- one pass -----------------------------------------------------------------------------

    def reader(self) -> Reader:
        """The reader, made on first need: imports the adapter and opens the library.

        :raises clib.LibError: the library cannot be loaded (tried again next pass).
        """
        if self._reader is None:
            module = importlib.import_module(READERS[self.manufacturer])
            library = self._make_library() if self._make_library else None
            self._reader = module.reader(library, self.host)
        return self._reader

    def _pass(
        self, body: Callable[[Reader, dict[str, pci.PciFunction]], list[T]]
    ) -> list[T] | None:
        functions: dict[str, pci.PciFunction] = {}
        if self.pci_check:
            vendor = MANUFACTURERS[self.manufacturer].pci_vendor
            functions = {f.bdf: f for f in self.census.functions(vendor)}
            if not functions:
                log.log(PER_DECISION, "no %s PCI device; library not loaded", self.manufacturer)
                return None
        with self._lock, ExitStack() as stack:
            try:
                reader = self.reader()
                stack.enter_context(reader.session())
            except clib.LibError as e:
                self._init_failed(len(functions), e)
                return None
            return body(reader, functions)

    def _init_failed(self, found: int, e: clib.LibError) -> None:
        """Raise unless the library is simply absent and no card on the bus says it should be."""
        name = self.manufacturer
        if found:
            plural = "device" if found == 1 else "devices"
            raise DetectionError(
                name, f"{found} {name} PCI {plural} found but {e.call} failed: {e.detail}"
            ) from e
        if isinstance(e, clib.LibUnavailable):
            log.info("%s: no library (%s); no %s accelerator detected", name, e.detail, name)
            return
        raise DetectionError(name, f"{e}") from e

    def _whole(self, call: Callable[[], T]) -> T:
        """A manufacturer-wide value: any failure fails this manufacturer's pass."""
        try:
            return call()
        except clib.LibError as e:
            raise DetectionError(self.manufacturer, str(e)) from e

    def _cards(self, reader: Reader) -> Iterator[tuple[Card, Any, _CardGet]]:
        """Identify each card; yields the card, its handle (None when lost) and its getter."""
        for index, slot in enumerate(self._whole(reader.slots)):
            try:
                handle, uuid = reader.identify(slot)
            except clib.LibError as e:
                known = self._last_seen.get(index)
                if isinstance(e, clib.LibLost) and known is not None:
                    log.warning("%s card %d (%s) is lost (%s); reporting it unhealthy",
                                self.manufacturer, index, known.uuid, e)  # fmt: skip
                    yield replace(known, lost=True), None, _CardGet(self.manufacturer, "")
                else:
                    log.warning("%s card %d cannot be identified (%s); leaving it out",
                                self.manufacturer, index, e)  # fmt: skip
                continue
            get = _CardGet(self.manufacturer, f"card {index} ({uuid})")
            try:
                yield Card(index=index, uuid=uuid), handle, get
            finally:
                reader.release(handle)

    def _detect(
        self, reader: Reader, functions: dict[str, pci.PciFunction]
    ) -> list[devices.DeviceGroup]:
        driver, runtime = self._whole(reader.versions)
        cards = []
        for card, handle, get in self._cards(reader):
            if handle is not None:
                reader.describe(handle, card, get)
                card.lost = get.lost
                if not card.lost:
                    self._last_seen[card.index] = card
            cards.append(card)
        return build_groups(
            self.manufacturer, cards, self._locality(functions), driver, runtime, self.simulated
        )

    def _locality(self, functions: dict[str, pci.PciFunction]) -> Callable[[Card], Any]:
        def topology(card: Card) -> devices.Topology | None:
            function = None
            if card.bus_id:
                function = functions.get(card.bus_id)
                if function is None and self.host.exists(f"{pci.PCI_DEVICES}/{card.bus_id}"):
                    function = pci.read_function(self.host, card.bus_id)
            return _topology(card, function)

        return topology

    def _sample(
        self, reader: Reader, _functions: dict[str, pci.PciFunction]
    ) -> list[devices.AcceleratorSample]:
        samples = []
        for card, handle, get in self._cards(reader):
            if handle is None:
                samples.append(devices.AcceleratorSample(id=card.uuid, unhealthy=True))
                continue
            known = self._last_seen.get(card.index)
            if known is None or known.uuid != card.uuid:
                self._last_seen[card.index] = card
            usage = reader.measure(handle, get)
            samples.append(_sample(card.uuid, usage, lost=get.lost))
        return samples


# -- shaping ------------------------------------------------------------------------------------


def drm_numbers(host: HostFS, bdf: str) -> tuple[int, ...] | None:
    """``(cardN, renderD minor)`` of a function from its sysfs ``drm`` entries; None without.

    DRM numbers follow neither PCI order nor the library's ids, so they are read, not derived.
    """
    card = render = None
    for entry in host.list_dir(f"{pci.PCI_DEVICES}/{bdf}/drm"):
        if entry.startswith("card") and entry[4:].isdigit() and card is None:
            card = int(entry[4:])
        elif entry.startswith("renderD") and entry[7:].isdigit() and render is None:
            render = int(entry[7:])
    if card is None:
        return None
    return (card,) if render is None else (card, render)


def pct(part: int, whole: int) -> int | None:
    """``part`` as an integer percent of ``whole``, rounded half up; None when ``whole`` is 0."""
    return (200 * part + whole) // (2 * whole) if whole > 0 else None


def _sample(uuid: str, usage: Usage, *, lost: bool) -> devices.AcceleratorSample:
    total, used = usage.memory_mib, usage.memory_used_mib
    return devices.AcceleratorSample(
        id=uuid,
        memory=total,
        memory_usage=used,
        memory_utilization=pct(used, total) if total is not None and used is not None else None,
        cores_utilization=usage.cores_utilization,
        temperature=usage.temperature,
        power_usage=usage.power_w,
        unhealthy=lost,
    )


def _topology(card: Card, function: pci.PciFunction | None) -> devices.Topology | None:
    """Bridges, NUMA node and CPUs from sysfs; the library's NUMA node where sysfs is silent."""
    bridges = function.bridges if function else ()
    numa = str(function.numa_node) if function and function.numa_node is not None else card.numa
    cpus = function.cpu_list if function else None
    if not (card.bus_id or bridges or numa or cpus):
        return None
    return devices.Topology(
        pci_bus_id=card.bus_id,
        pci_root_id=bridges[0] if bridges else None,
        pci_switches=tuple(reversed(bridges)) or None,
        numa_affinity=numa,
        cpu_affinity=cpus,
    )


def _status(manufacturer: str, card: Card) -> devices.AcceleratorStatus:
    """A card in partition mode offers its partitions and no software slices."""
    if card.physical_sliced is not None:
        return devices.AcceleratorStatus(unhealthy=card.lost, physical_sliced=card.physical_sliced)
    facts = MANUFACTURERS[manufacturer]
    logical = devices.LogicalSliced(
        cores_percentage_overcommit=facts.cores_overcommit, count=facts.logical_slices
    )
    return devices.AcceleratorStatus(unhealthy=card.lost, logical_sliced=logical)


def build_groups(
    manufacturer: str,
    cards: list[Card],
    topology: Callable[[Card], devices.Topology | None],
    driver_version: str | None,
    runtime_version: str | None,
    simulated: bool,
) -> list[devices.DeviceGroup]:
    """One group per product and memory size in whole GiB; group figures from the first card.

    Chips of one product whose usable memory differs by a few MiB (the two chips of a 310P3
    duo card) share a group whose memory is the smallest, so whatever fits the group fits every
    member and no two groups get the same memory-suffixed id. A card whose name or memory was
    not read joins its product's only group, so a card lost mid-read does not rename its
    siblings' group.
    """
    members: dict[tuple[str, int | None], list[Card]] = {}
    for card in cards:
        members.setdefault(_group_key(card, cards, f"{manufacturer} accelerator"), []).append(card)
    memory = {
        key: min((c.memory_mib for c in group if c.memory_mib is not None), default=None)
        for key, group in members.items()
    }
    final_ids = devices.disambiguated_ids(
        (devices.group_id(manufacturer, name), memory[(name, gib)]) for name, gib in members
    )
    groups = []
    for (name, gib), group_cards in members.items():
        mib = memory[(name, gib)]
        groups.append(
            devices.DeviceGroup(
                id=final_ids[(devices.group_id(manufacturer, name), mib)],
                manufacturer=manufacturer,
                name=name,
                memory=mib,
                cores=_first(c.cores for c in group_cards),
                driver_version=_first(c.driver_version for c in group_cards) or driver_version,
                runtime_version=runtime_version,
                compute_capability=_first(c.compute_capability for c in group_cards),
                family=_first(c.family for c in group_cards),
                simulated=simulated,
                accelerators=tuple(_accelerator(manufacturer, c, topology) for c in group_cards),
            )
        )
    return groups


def _accelerator(
    manufacturer: str, card: Card, topology: Callable[[Card], devices.Topology | None]
) -> devices.Accelerator:
    return devices.Accelerator(
        id=card.uuid,
        index=card.index,
        physical_indexes=card.physical_indexes,
        topology=topology(card),
        status=_status(manufacturer, card),
    )


def _gib(mib: int | None) -> int | None:
    return None if mib is None else (mib + 512) // 1024


def _group_key(card: Card, cards: list[Card], unknown: str) -> tuple[str, int | None]:
    names = {c.name for c in cards if c.name}
    name = card.name or (names.pop() if len(names) == 1 else unknown)
    gib = _gib(card.memory_mib)
    if gib is None:
        known = {_gib(c.memory_mib) for c in cards if (c.name or name) == name and c.memory_mib}
        if len(known) == 1:
            gib = known.pop()
    return name, gib


def _first(values: Iterator[T | None]) -> T | None:
    return next((v for v in values if v is not None), None)

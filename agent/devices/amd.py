"""AMD detection and sampling from the kernel alone: sysfs, KFD topology and host files.

No ROCm user-space library is loaded (no amdsmi, rocm-smi, HSA or libdrm calls), so detection
works in a container without ROCm and cannot start a ROCr runtime inside the agent. Every value
comes from a file the amdgpu driver or KFD publishes, read through :class:`HostFS`:

- identity: ``/sys/bus/pci/devices/<bdf>/unique_id`` (else KFD's ``unique_id``); a card with
  neither is left out with a warning, because its id must never be a PCI address;
- device nodes: the function's ``drm/cardN`` and ``drm/renderD<M>`` entries (not enumeration
  order: DRM numbers neither follow PCI order nor step by one on every part);
- compute units and gfx target: the KFD node matched by PCI location, else by render minor;
- versions: ``/sys/module/amdgpu/version`` (DKMS driver) else the kernel release; ROCm from
  ``/opt/rocm/.info/version`` when the host's ``/opt/rocm`` is visible.

Health is not read yet: every card reports ``unhealthy: False``; the device agent's health loop
(uncorrectable ECC, a card gone from sysfs) will own that.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import msgspec

from agent.devices import amdgpu_ids, pci
from agent.devices.hostfs import HostFS
from agent.devices.manufacturers import MANUFACTURERS
from agent.errors import DetectionError, HostReadError
from bus import devices

log = logging.getLogger(__name__)

MANUFACTURER = "amd"
_AMD = MANUFACTURERS[MANUFACTURER]
_KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
_CARD = re.compile(r"^card(\d+)$")
_RENDER = re.compile(r"^renderD(\d+)$")


@dataclass(frozen=True)
class _Card:
    """One amdgpu-driven function, with what sysfs and KFD say about it."""

    index: int
    function: pci.PciFunction
    card: int
    render_minor: int | None
    kfd: dict[str, int]

    @property
    def base(self) -> str:
        return f"{pci.PCI_DEVICES}/{self.function.bdf}"


class AmdBackend:
    """Detection and sampling for amdgpu-driven accelerators (see the module docstring)."""

    manufacturer = MANUFACTURER

    def __init__(self, *, host: HostFS, pci_check: bool = True, simulated: bool = False) -> None:
        self.host = host
        self.pci_check = pci_check
        self.simulated = simulated

    def detect(self) -> list[devices.DeviceGroup]:
        """Return the amdgpu cards grouped by product and memory size."""
        accelerators: list[tuple[devices.DeviceGroup, devices.Accelerator]] = []
        try:
            cards = self._cards()
            driver_version = self._driver_version()
            runtime_version = self._runtime_version()
            for card in cards:
                described = self._describe(card, driver_version, runtime_version)
                if described is not None:
                    accelerators.append(described)
        except HostReadError as e:
            raise DetectionError(MANUFACTURER, str(e)) from e
        return _group(accelerators)

    def sample(self) -> list[devices.AcceleratorSample]:
        """Read each card's usage now; an attribute the card lacks leaves its field out.

        Rounding: MiB are floored (``bytes >> 20``, as memory totals are); the memory percentage
        is computed from bytes and rounded half up; temperature (m°C) and power (µW) are rounded
        half up to whole degrees and watts.
        """
        samples = []
        try:
            for card in self._cards():
                unique = self._unique_id(card)
                if unique is not None:
                    samples.append(self._sample(card, unique))
        except HostReadError as e:
            raise DetectionError(MANUFACTURER, str(e)) from e
        return samples

    # -- enumeration ---------------------------------------------------------------------------

    def _cards(self) -> list[_Card]:
        """The amdgpu-driven functions in PCI-address order; ``index`` is the position here.

        A card left out later (no unique id) keeps its slot, so the others' indexes do not shift
        with one card's sysfs trouble.
        """
        functions = self._functions()
        driven = [f for f in functions if self._is_amdgpu(f.bdf)]
        if functions and not driven:
            raise DetectionError(
                MANUFACTURER,
                f"{len(functions)} AMD PCI accelerators found but none is driven by amdgpu",
            )
        for f in functions:
            if f not in driven:
                log.warning("AMD PCI accelerator %s is not driven by amdgpu; skipped", f.bdf)
        kfd_nodes = self._kfd_nodes()
        cards = []
        for index, f in enumerate(driven):
            card, render = self._drm_numbers(f.bdf)
            node = _match_kfd(kfd_nodes, f.bdf, render)
            cards.append(_Card(index, f, card, render, node))
        return cards

    def _functions(self) -> list[pci.PciFunction]:
        if self.pci_check:
            return pci.scan(self.host, _AMD.pci_vendor)
        found: dict[str, pci.PciFunction] = {}
        for entry in self.host.list_dir("/sys/class/drm"):
            if not _CARD.match(entry):
                continue
            target = self.host.resolve_link(f"/sys/class/drm/{entry}/device")
            bdf = target.rsplit("/", 1)[-1] if target else ""
            if bdf in found or not self.host.exists(f"{pci.PCI_DEVICES}/{bdf}"):
                continue
            function = pci.read_function(self.host, bdf)
            if function.vendor == _AMD.pci_vendor and pci.is_accelerator_class(function.pci_class):
                found[bdf] = function
        return [found[bdf] for bdf in sorted(found)]

    def _is_amdgpu(self, bdf: str) -> bool:
        """Bound to amdgpu: DRM card entries, and a driver link (when present) named amdgpu.

        The DRM entries alone would also accept the legacy ``radeon`` driver.
        """
        base = f"{pci.PCI_DEVICES}/{bdf}"
        if not any(_CARD.match(e) for e in self.host.list_dir(f"{base}/drm")):
            return False
        driver = self.host.resolve_link(f"{base}/driver")
        return driver is None or driver.rsplit("/", 1)[-1] == "amdgpu"

    def _drm_numbers(self, bdf: str) -> tuple[int, int | None]:
        card = render = None
        for entry in self.host.list_dir(f"{pci.PCI_DEVICES}/{bdf}/drm"):
            if (m := _CARD.match(entry)) and card is None:
                card = int(m.group(1))
            elif (m := _RENDER.match(entry)) and render is None:
                render = int(m.group(1))
        assert card is not None  # _is_amdgpu checked there is one
        return card, render

    def _kfd_nodes(self) -> list[dict[str, int]]:
        """The GPU nodes of KFD's topology (CPU nodes have no SIMDs and are dropped)."""
        nodes = []
        for name in self.host.list_dir(_KFD_NODES):
            text = self.host.read_text(f"{_KFD_NODES}/{name}/properties")
            props = _parse_properties(text or "")
            if props.get("simd_count", 0) > 0:
                nodes.append(props)
        return nodes

    # -- one card ------------------------------------------------------------------------------

    def _unique_id(self, card: _Card) -> str | None:
        text = (self.host.read_text(f"{card.base}/unique_id") or "").lower()
        if text and text.strip("0"):
            return f"GPU-{text}"
        kfd_id = card.kfd.get("unique_id", 0)
        if kfd_id:
            return f"GPU-{kfd_id:016x}"
        return None

    def _describe(
        self, card: _Card, driver_version: str | None, runtime_version: str | None
    ) -> tuple[devices.DeviceGroup, devices.Accelerator] | None:
        unique = self._unique_id(card)
        if unique is None:
            log.warning(
                "AMD accelerator %s has no unique id (sysfs or KFD); left out", card.function.bdf
            )
            return None
        name = self._name(card.function)
        target = card.kfd.get("gfx_target_version") or None
        group = devices.DeviceGroup(
            id=devices.group_id(MANUFACTURER, name),
            manufacturer=MANUFACTURER,
            name=name,
            memory=_mib(self.host.read_int(f"{card.base}/mem_info_vram_total")),
            cores=_compute_units(card.kfd),
            driver_version=driver_version,
            runtime_version=runtime_version,
            compute_capability=amdgpu_ids.gfx_name(target) if target else None,
            family=amdgpu_ids.family_name(target) if target else None,
            simulated=self.simulated,
        )
        accelerator = devices.Accelerator(
            id=unique,
            index=card.index,
            physical_indexes=_physical_indexes(card),
            topology=_topology(card.function),
            status=devices.AcceleratorStatus(
                unhealthy=False,
                logical_sliced=devices.LogicalSliced(
                    cores_percentage_overcommit=_AMD.cores_overcommit, count=_AMD.logical_slices
                ),
            ),
        )
        return group, accelerator

    def _name(self, f: pci.PciFunction) -> str:
        return (
            amdgpu_ids.marketing_name(self.host, f.device, f.revision)
            or amdgpu_ids.pci_ids_name(self.host, f.device, f.subsystem_vendor, f.subsystem_device)
            or f"AMD GPU {f.device:04x}"
        )

    def _driver_version(self) -> str | None:
        return self.host.read_text("/sys/module/amdgpu/version") or self.host.read_text(
            "/proc/sys/kernel/osrelease"
        )

    def _runtime_version(self) -> str | None:
        text = self.host.read_text("/opt/rocm/.info/version")
        m = re.match(r"^(\d+)\.(\d+)", text or "")
        return f"{m.group(1)}.{m.group(2)}" if m else None

    def _sample(self, card: _Card, unique: str) -> devices.AcceleratorSample:
        total = self.host.read_int(f"{card.base}/mem_info_vram_total")
        used = self.host.read_int(f"{card.base}/mem_info_vram_used")
        hwmon = self._hwmon(card)
        return devices.AcceleratorSample(
            id=unique,
            memory=_mib(total),
            memory_usage=_mib(used),
            memory_utilization=_round(used * 100, total) if used is not None and total else None,
            cores_utilization=self.host.read_int(f"{card.base}/gpu_busy_percent"),
            temperature=self._edge_temperature(hwmon),
            power_usage=self._power(hwmon),
            unhealthy=False,
        )

    def _hwmon(self, card: _Card) -> str | None:
        entries = [e for e in self.host.list_dir(f"{card.base}/hwmon") if e.startswith("hwmon")]
        return f"{card.base}/hwmon/{entries[0]}" if entries else None

    def _edge_temperature(self, hwmon: str | None) -> int | None:
        """The sensor labelled ``edge`` (amdgpu's temp1 on dGPUs), else ``temp1_input``.

        Edge, not junction: junction runs 10-20 °C hotter and is not what other tools show first.
        """
        if hwmon is None:
            return None
        chosen = f"{hwmon}/temp1_input"
        for entry in self.host.list_dir(hwmon):
            m = re.match(r"^(temp\d+)_label$", entry)
            if m and self.host.read_text(f"{hwmon}/{entry}") == "edge":
                chosen = f"{hwmon}/{m.group(1)}_input"
                break
        value = self.host.read_int(chosen)
        return None if value is None else _round(value, 1000)

    def _power(self, hwmon: str | None) -> int | None:
        """``power1_average`` (µW); newer ASICs publish only ``power1_input``."""
        if hwmon is None:
            return None
        value = self.host.read_int(f"{hwmon}/power1_average")
        if value is None:
            value = self.host.read_int(f"{hwmon}/power1_input")
        return None if value is None else _round(value, 1_000_000)


def _parse_properties(text: str) -> dict[str, int]:
    """KFD ``properties``: one ``name value`` pair per line, values decimal."""
    props = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            props[parts[0]] = int(parts[1])
    return props


def _match_kfd(nodes: list[dict[str, int]], bdf: str, render: int | None) -> dict[str, int]:
    """The KFD node of a function: by domain and ``location_id`` (bus<<8 | dev<<3 | fn), else by
    render minor; empty when KFD is absent (not loaded, or no ``/sys/class/kfd`` visible)."""
    domain, bus, rest = bdf.split(":")
    dev, fn = rest.split(".")
    location = int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn, 16)
    for node in nodes:
        if node.get("location_id") == location and node.get("domain", 0) == int(domain, 16):
            return node
    for node in nodes:
        if render is not None and node.get("drm_render_minor") == render:
            return node
    return {}


def _physical_indexes(card: _Card) -> tuple[int, ...]:
    """``[cardN, renderD minor]``; just ``[cardN]`` when the function has no render node."""
    return (card.card,) if card.render_minor is None else (card.card, card.render_minor)


def _compute_units(kfd: dict[str, int]) -> int | None:
    simds, per_cu = kfd.get("simd_count"), kfd.get("simd_per_cu")
    return simds // per_cu if simds and per_cu else None


def _topology(f: pci.PciFunction) -> devices.Topology:
    """Root = the outermost bridge; switches = the whole upstream bridge path, innermost first
    (as the NVIDIA backend and the reference's ``pciSwitches`` have it)."""
    return devices.Topology(
        pci_bus_id=f.bdf,
        pci_root_id=f.bridges[0] if f.bridges else None,
        pci_switches=tuple(reversed(f.bridges)) or None,
        numa_affinity=str(f.numa_node) if f.numa_node is not None else None,
        cpu_affinity=f.cpu_list,
    )


def _mib(value: int | None) -> int | None:
    return None if value is None else value >> 20


def _round(numerator: int, denominator: int) -> int:
    """Integer division rounded half up (no float, so 44500 m°C is 45 °C on every platform)."""
    return (2 * numerator + denominator) // (2 * denominator)


def _group(
    described: list[tuple[devices.DeviceGroup, devices.Accelerator]],
) -> list[devices.DeviceGroup]:
    """Merge cards of one product and memory size into one group.

    Ids shared by different memory sizes are suffixed by :func:`bus.devices.disambiguated_ids`.
    """
    groups: dict[tuple[str, int | None], devices.DeviceGroup] = {}
    members: dict[tuple[str, int | None], list[devices.Accelerator]] = {}
    for group, accelerator in described:
        key = (group.id, group.memory)
        groups.setdefault(key, group)
        members.setdefault(key, []).append(accelerator)
    final_ids = devices.disambiguated_ids(groups)
    result = []
    for key, group in groups.items():
        gid = final_ids[key]
        result.append(msgspec.structs.replace(group, id=gid, accelerators=tuple(members[key])))
    return result

"""Hygon DCUs through DTK's ROCm SMI, with sysfs and KFD for what ROCm SMI does not say.

- identity: ``GPU-`` and ROCm SMI's 64-bit unique id in lower-case hex without padding, as
  gpustack-runtime writes it (``hex()`` minus its ``0x``), so the same card has the same id in
  our ``Devices`` and in GPUStack's own detector;
- ``physicalIndexes``: ``[cardN, renderD minor]`` from the function's ``drm`` entries (card and
  render numbers are not the index: ``card1``/``renderD128`` for index 0 on real hosts);
- cores and compute capability: the KFD topology node at the card's PCI location (compute
  units = SIMDs / SIMDs per CU; ``gfx`` target), as for AMD;
- versions: the ``hycu`` (or ``hydcu``) module version, and DTK's ``.info/version``;
- partitions: when DTK's DMI MIG library is present and the node's MIG mode is on, each DCU
  offers its partition profiles (``physicalSliced``) instead of software slices; without the
  library a DCU is never reported as partitioned.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from agent.devices import amdgpu_ids, vendor
from agent.devices.hostfs import HostFS
from agent.devices.libs import clib, dmimig, rocmsmi
from agent.devices.vendor import Card, Get, Usage
from bus import devices

log = logging.getLogger(__name__)

MANUFACTURER = "hygon"
MODULE_VERSIONS = ("/sys/module/hycu/version", "/sys/module/hydcu/version")
DTK_VERSIONS = ("/opt/dtk/.info/version", "/opt/hyhal/.info/version")
_KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
_RESOURCE_SEGMENT = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class HygonReader:
    """:class:`agent.devices.vendor.Reader` over ROCm SMI; a slot is a device index."""

    manufacturer = MANUFACTURER
    library = rocmsmi.LIBRARY

    def __init__(self, lib: rocmsmi.RocmSmi, host: HostFS, mig: dmimig.DmiMig | None) -> None:
        self.smi = lib
        self.host = host
        self.mig = mig
        self._mig_on = False

    @contextmanager
    def session(self) -> Iterator[object]:
        self.smi.init()
        try:
            yield self
        finally:
            with suppress(clib.LibError):
                self.smi.shutdown()

    def versions(self) -> tuple[str | None, str | None]:
        driver = next(filter(None, (self.host.read_text(p) for p in MODULE_VERSIONS)), None)
        dtk = next(filter(None, (self.host.read_text(p) for p in DTK_VERSIONS)), None)
        self._mig_on = False
        if self.mig is not None:
            try:
                self._mig_on = self.mig.mig_mode()
            except clib.LibError as e:
                log.warning("hygon: MIG mode unreadable (%s); no partitions reported", e)
        return driver, clib.brief_version(dtk)

    def slots(self) -> range:
        return range(self.smi.device_count())

    def identify(self, slot: int) -> tuple[Any, str]:
        unique = self.smi.unique_id(slot)
        if not unique:
            raise clib.LibFailed("rsmi_dev_unique_id_get", 14, "NO_DATA", "unique id 0")
        return slot, f"GPU-{unique:x}"

    def describe(self, handle: int, card: Card, get: Get) -> None:
        card.bus_id = get(self.smi.pci_bus_id, handle)
        if card.bus_id:
            card.physical_indexes = vendor.drm_numbers(self.host, card.bus_id)
            kfd = self._kfd_node(card.bus_id)
            simds, per_cu = kfd.get("simd_count"), kfd.get("simd_per_cu")
            card.cores = simds // per_cu if simds and per_cu else None
            target = kfd.get("gfx_target_version")
            card.compute_capability = amdgpu_ids.gfx_name(target) if target else None
        card.name = get(self.smi.name, handle) or None
        memory = get(self.smi.memory, handle)
        card.memory_mib = memory[0] >> 20 if memory else None
        if self.mig is not None and self._mig_on and card.bus_id:
            profiles = get(self.mig.profiles, card.bus_id)
            card.physical_sliced = _physical(profiles or [])

    def _kfd_node(self, bdf: str) -> dict[str, int]:
        """The KFD GPU node at the card's PCI location (domain and bus<<8 | dev<<3 | fn)."""
        domain, bus, rest = bdf.split(":")
        dev, fn = rest.split(".")
        location = int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn, 16)
        for name in self.host.list_dir(_KFD_NODES):
            props = {}
            for line in (self.host.read_text(f"{_KFD_NODES}/{name}/properties") or "").splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                    props[parts[0]] = int(parts[1])
            if props.get("location_id") == location and props.get("domain", 0) == int(domain, 16):
                return props
        return {}

    def measure(self, handle: int, get: Get) -> Usage:
        memory = get(self.smi.memory, handle)
        temperature = get(self.smi.temperature_mc, handle)
        power = get(self.smi.power_uw, handle)
        return Usage(
            memory_mib=memory[0] >> 20 if memory else None,
            memory_used_mib=memory[1] >> 20 if memory else None,
            cores_utilization=get(self.smi.busy_percent, handle),
            temperature=temperature // 1000 if temperature is not None else None,
            power_w=power // 1_000_000 if power is not None else None,
        )

    def release(self, handle: Any) -> None:
        pass


def _physical(profiles: list[tuple[str, int, int, int]]) -> devices.PhysicalSliced:
    """Profiles a pod can ask for: the library's name when it is a valid resource-name segment,
    else ``<slices>g.<GiB>gb``; memory slices are compute slices (no separate memory split)."""
    offered = tuple(
        devices.SliceProfile(
            name=name if _RESOURCE_SEGMENT.match(name) else f"{slices}g.{mib >> 10}gb",
            memory_mib=mib,
            compute_slices=slices,
            memory_slices=slices,
            count=count,
        )
        for name, mib, slices, count in profiles
        if count > 0 and slices > 0
    )
    return devices.PhysicalSliced(
        profiles=offered, count=max((p.count for p in offered), default=0)
    )


def reader(library: Any | None, host: HostFS) -> HygonReader:
    """The reader over ``library`` (a simulator, whose ``companion`` simulates the DMI MIG
    library), else over DTK's ``librocm_smi64.so`` and, when present, ``libhydmi_mig.so``.

    :raises clib.LibUnavailable: ROCm SMI cannot be loaded (the MIG library is optional).
    """
    mig: dmimig.DmiMig | None = None
    if library is not None:
        companion = getattr(library, "companion", None)
        mig = dmimig.DmiMig(companion) if companion is not None else None
        return HygonReader(rocmsmi.RocmSmi(library), host, mig)
    smi = rocmsmi.RocmSmi(rocmsmi.load())
    try:
        mig = dmimig.DmiMig(dmimig.load())
    except clib.LibUnavailable as e:
        log.info("hygon: %s; DCU partitions are not reported", e.detail)
        mig = None
    return HygonReader(smi, host, mig)

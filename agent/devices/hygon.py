"""Hygon DCUs through DTK's ROCm SMI, with sysfs and KFD for what ROCm SMI does not say.

- identity: ``GPU-`` and ROCm SMI's 64-bit unique id as 16 zero-padded hex digits (an
  un-padded rendering would make ids of the same card differ between tools);
- ``physicalIndexes``: ``[cardN, renderD minor]`` from the function's ``drm`` entries (card and
  render numbers are not the index: ``card1``/``renderD128`` for index 0 on real hosts);
- cores and compute capability: the KFD topology node at the card's PCI location (compute
  units = SIMDs / SIMDs per CU; ``gfx`` target), as for AMD;
- versions: the ``hycu`` (or ``hydcu``) module version, and DTK's ``.info/version``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from agent.devices import amdgpu_ids, clib, rocmsmi, vendor
from agent.devices.hostfs import HostFS
from agent.devices.vendor import Card, Get, Usage

MANUFACTURER = "hygon"
MODULE_VERSIONS = ("/sys/module/hycu/version", "/sys/module/hydcu/version")
DTK_VERSIONS = ("/opt/dtk/.info/version", "/opt/hyhal/.info/version")
_KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def _round(numerator: int, denominator: int) -> int:
    return (2 * numerator + denominator) // (2 * denominator)


class HygonReader:
    """:class:`agent.devices.vendor.Reader` over ROCm SMI; a slot is a device index."""

    manufacturer = MANUFACTURER
    library = rocmsmi.LIBRARY

    def __init__(self, lib: rocmsmi.RocmSmi, host: HostFS) -> None:
        self.smi = lib
        self.host = host

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
        return driver, clib.brief_version(dtk)

    def slots(self) -> range:
        return range(self.smi.device_count())

    def identify(self, slot: int) -> tuple[Any, str]:
        unique = self.smi.unique_id(slot)
        if not unique:
            raise clib.LibFailed("rsmi_dev_unique_id_get", 14, "NO_DATA", "unique id 0")
        return slot, f"GPU-{unique:016x}"

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
            temperature=_round(temperature, 1000) if temperature is not None else None,
            power_w=power // 1_000_000 if power is not None else None,
        )

    def release(self, handle: Any) -> None:
        pass


def reader(library: Any | None, host: HostFS) -> HygonReader:
    """The reader over ``library`` (a simulator), else over DTK's ``librocm_smi64.so``.

    :raises clib.LibUnavailable: the library cannot be loaded.
    """
    return HygonReader(rocmsmi.RocmSmi(library if library is not None else rocmsmi.load()), host)

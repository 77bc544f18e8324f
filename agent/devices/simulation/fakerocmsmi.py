"""A simulated DTK ``librocm_smi64.so`` built from a profile's ``hygon`` section.

ROCm SMI's units (bytes, µW, m°C) and its packed PCI id, with a partition number in bits 28-31
to be masked off. Only the edge sensor (0) answers the temperature call. When the profile says
``migLibrary: true``, :attr:`SimulatedRocmSmi.companion` simulates ``libhydmi_mig.so`` too: the
node-wide MIG switch, handles by PCI bus id, and profile info asked by slice-count index.
"""

from __future__ import annotations

from typing import Any

from agent.devices.libs import rocmsmi
from agent.devices.simulation.fakelib import (
    SimulatedLibrary,
    accepts_c_integers,
    put,
    put_text,
    written,
)
from agent.devices.simulation.profiles import HygonCard, HygonHost

_INVALID = 1
_INSUFFICIENT_SIZE = 11


class SimulatedRocmSmi(SimulatedLibrary):
    CODES = rocmsmi.CODES
    LOST = "FILE_ERROR"
    UNINITIALIZED = "INIT_ERROR"

    def __init__(self, host: HygonHost) -> None:
        super().__init__(host.init_error, [c.faults for c in host.cards])
        self.host = host
        self.companion = SimulatedDmiMig(host) if host.mig_library else None

    def _gate(self, name: str, index: int) -> tuple[int, HygonCard | None]:
        if not 0 <= index < len(self.host.cards):
            self.calls.append((name, None))
            return _INVALID, None
        return self._card(name, index), self.host.cards[index]

    def rsmi_init(self, flags: Any) -> int:
        return self._init("rsmi_init")

    def rsmi_shut_down(self) -> int:
        self.calls.append(("rsmi_shut_down", None))
        self.initialized = False
        return 0

    def rsmi_num_monitor_devices(self, count: Any) -> int:
        status = self._system("rsmi_num_monitor_devices")
        if status == 0:
            put(count, len(self.host.cards))
        return status

    def rsmi_dev_unique_id_get(self, index: int, value: Any) -> int:
        status, card = self._gate("rsmi_dev_unique_id_get", index)
        if status == 0 and card is not None:
            put(value, card.unique_id)
        return status

    def rsmi_dev_pci_id_get(self, index: int, value: Any) -> int:
        status, card = self._gate("rsmi_dev_pci_id_get", index)
        if status == 0 and card is not None:
            domain, bus, rest = card.bus_id.split(":")
            dev, fn = rest.split(".")
            packed = int(domain, 16) << 32 | int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn, 16)
            put(value, packed | 1 << 28)  # partition 1: must not leak into the address
        return status

    def rsmi_dev_name_get(self, index: int, buffer: Any, size: Any) -> int:
        status, card = self._gate("rsmi_dev_name_get", index)
        if status or card is None:
            return status
        room = getattr(size, "value", size)
        return _INSUFFICIENT_SIZE if put_text(buffer, card.name, room) else 0

    def rsmi_dev_memory_total_get(self, index: int, kind: int, value: Any) -> int:
        status, card = self._gate("rsmi_dev_memory_total_get", index)
        if status == 0 and card is not None:
            put(value, card.vram_total_bytes)
        return status

    def rsmi_dev_memory_usage_get(self, index: int, kind: int, value: Any) -> int:
        status, card = self._gate("rsmi_dev_memory_usage_get", index)
        if status == 0 and card is not None:
            put(value, card.vram_used_bytes)
        return status

    def rsmi_dev_busy_percent_get(self, index: int, value: Any) -> int:
        status, card = self._gate("rsmi_dev_busy_percent_get", index)
        if status == 0 and card is not None:
            put(value, card.busy_percent)
        return status

    def rsmi_dev_temp_metric_get(self, index: int, sensor: int, metric: int, value: Any) -> int:
        status, card = self._gate("rsmi_dev_temp_metric_get", index)
        if status == 0 and card is not None:
            if sensor != 0:
                return rocmsmi.NOT_SUPPORTED
            put(value, card.edge_temperature_mc)
        return status

    def rsmi_dev_power_get(self, index: int, value: Any, kind: Any) -> int:
        status, card = self._gate("rsmi_dev_power_get", index)
        if status == 0 and card is not None:
            if card.power_uw is None:
                return rocmsmi.NOT_SUPPORTED
            put(value, card.power_uw)
            put(kind, 0)  # RSMI_CURRENT_POWER
        return status

    def rsmi_dev_power_ave_get(self, index: int, sensor: int, value: Any) -> int:
        status, card = self._gate("rsmi_dev_power_ave_get", index)
        if status == 0 and card is not None:
            put(value, card.power_average_uw)
        return status


@accepts_c_integers
class SimulatedDmiMig:
    """``libhydmi_mig.so``: NVML's MIG symbol names, no init call, status codes as NVML's."""

    def __init__(self, host: HygonHost) -> None:
        self.host = host
        self.calls: list[tuple[str, int | None]] = []

    def nvmlGetSystemMigMode(self, current: Any, pending: Any) -> int:
        self.calls.append(("nvmlGetSystemMigMode", None))
        put(current, int(self.host.mig_mode))
        put(pending, int(self.host.mig_mode))
        return 0

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: bytes, handle: Any) -> int:
        self.calls.append(("nvmlDeviceGetHandleByPciBusId", None))
        for position, card in enumerate(self.host.cards):
            if card.bus_id == bus_id.decode().lower():
                put(handle, position + 1)
                return 0
        return 6  # NOT_FOUND

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, index: int, info: Any) -> int:
        position = (getattr(handle, "value", handle) or 0) - 1
        self.calls.append(("nvmlDeviceGetGpuInstanceProfileInfo", position))
        if not 0 <= position < len(self.host.cards) or not self.host.mig_mode:
            return 3  # NOT_SUPPORTED
        card = self.host.cards[position]
        found = next((p for p in card.mig_profiles if p.slice_count == index + 1), None)
        if found is None:
            return self.host.mig_gap_code
        out = written(info, "dmiGpuInstanceProfileInfo_t")
        out.id, out.gi_count_max, out.cu_count = index, found.instance_count, found.cu_count
        out.gpu_slice_count, out.memory_size_MB = found.slice_count, found.memory_mib
        out.name = found.name.encode()
        return 0

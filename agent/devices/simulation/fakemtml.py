"""A simulated ``libmtml.so`` built from a profile's ``mthreads`` section.

MTML's object model is kept honest: every handle (library, system, device, memory, GPU) is an
opaque pointer value (``c_void_p``, or a binding's typed pointer) that must be freed by its ``Free`` call; a call on a handle already
freed answers ``INVALID_ARGUMENT``, and :attr:`SimulatedMtml.live` shows what a pass leaked.
Units are MTML's: bytes, mW, °C.
"""

from __future__ import annotations

from typing import Any

from agent.devices.libs import mtml
from agent.devices.simulation.fakelib import (
    SimulatedLibrary,
    handle_value,
    put,
    put_handle,
    put_text,
    written,
)
from agent.devices.simulation.profiles import MthreadsCard, MthreadsHost

_INVALID = 3
_LIBRARY, _SYSTEM = 1, 2
_DEVICE, _MEMORY, _GPU = 1000, 2000, 3000
_MIB = 1 << 20


class SimulatedMtml(SimulatedLibrary):
    CODES = mtml.CODES
    LOST = "DRIVER_FAILURE"
    UNINITIALIZED = "UNINITIALIZED"

    def __init__(self, host: MthreadsHost) -> None:
        super().__init__(host.init_error, [c.faults for c in host.cards])
        self.host = host
        self.live: set[int] = set()

    def _open(self, ref: Any, value: int) -> int:
        put_handle(ref, value)
        self.live.add(value)
        return 0

    def _free(self, name: str, handle: Any) -> int:
        value = handle_value(handle)
        self.calls.append((name, None))
        if value not in self.live:
            return _INVALID
        self.live.discard(value)
        return 0

    def _gate(self, name: str, handle: Any, base: int) -> tuple[int, MthreadsCard | None]:
        value = handle_value(handle)
        position = value - base
        if value not in self.live or not 0 <= position < len(self.host.cards):
            self.calls.append((name, None))
            return _INVALID, None
        return self._card(name, position), self.host.cards[position]

    # -- library and system --------------------------------------------------------------------

    def mtmlLibraryInit(self, lib: Any) -> int:
        status = self._init("mtmlLibraryInit")
        return status or self._open(lib, _LIBRARY)

    def mtmlLibraryShutDown(self, lib: Any) -> int:
        status = self._free("mtmlLibraryShutDown", lib)
        self.initialized = False
        return status

    def mtmlLibraryInitSystem(self, lib: Any, system: Any) -> int:
        status = self._system("mtmlLibraryInitSystem")
        return status or self._open(system, _SYSTEM)

    def mtmlLibraryFreeSystem(self, system: Any) -> int:
        return self._free("mtmlLibraryFreeSystem", system)

    def mtmlSystemGetDriverVersion(self, system: Any, buffer: Any, size: int) -> int:
        status = self._system("mtmlSystemGetDriverVersion")
        if status or handle_value(system) not in self.live:
            return status or _INVALID
        return 6 if put_text(buffer, self.host.driver_version, size) else 0

    def mtmlLibraryCountDevice(self, lib: Any, count: Any) -> int:
        status = self._system("mtmlLibraryCountDevice")
        if status == 0:
            put(count, len(self.host.cards))
        return status

    def mtmlLibraryInitDeviceByIndex(self, lib: Any, index: int, device: Any) -> int:
        if not 0 <= index < len(self.host.cards):
            self.calls.append(("mtmlLibraryInitDeviceByIndex", None))
            return _INVALID
        status = self._card("mtmlLibraryInitDeviceByIndex", index)
        return status or self._open(device, _DEVICE + index)

    def mtmlLibraryFreeDevice(self, device: Any) -> int:
        return self._free("mtmlLibraryFreeDevice", device)

    # -- device --------------------------------------------------------------------------------

    def mtmlDeviceGetUUID(self, device: Any, buffer: Any, size: int) -> int:
        status, card = self._gate("mtmlDeviceGetUUID", device, _DEVICE)
        if status or card is None:
            return status
        return 6 if put_text(buffer, card.uuid, size) else 0

    def mtmlDeviceGetName(self, device: Any, buffer: Any, size: int) -> int:
        status, card = self._gate("mtmlDeviceGetName", device, _DEVICE)
        if status or card is None:
            return status
        return 6 if put_text(buffer, card.name, size) else 0

    def mtmlDeviceGetPciInfo(self, device: Any, info: Any) -> int:
        status, card = self._gate("mtmlDeviceGetPciInfo", device, _DEVICE)
        if status == 0 and card is not None:
            out = written(info, "MtmlPciInfo")
            out.sbdf = card.bus_id.encode()
            domain, bus, rest = card.bus_id.split(":")
            out.segment, out.bus = int(domain, 16), int(bus, 16)
            out.device, out.pciDeviceId = int(rest.split(".")[0], 16), card.pci_device_id
        return status

    def mtmlDeviceCountGpuCores(self, device: Any, cores: Any) -> int:
        status, card = self._gate("mtmlDeviceCountGpuCores", device, _DEVICE)
        if status == 0 and card is not None:
            if card.gpu_cores is None:
                return mtml.NOT_SUPPORTED
            put(cores, card.gpu_cores)
        return status

    def mtmlDeviceGetPowerUsage(self, device: Any, power: Any) -> int:
        status, card = self._gate("mtmlDeviceGetPowerUsage", device, _DEVICE)
        if status == 0 and card is not None:
            put(power, card.power_mw)
        return status

    def mtmlDeviceInitMemory(self, device: Any, memory: Any) -> int:
        status, _ = self._gate("mtmlDeviceInitMemory", device, _DEVICE)
        return status or self._open(memory, _MEMORY + handle_value(device) - _DEVICE)

    def mtmlDeviceFreeMemory(self, memory: Any) -> int:
        return self._free("mtmlDeviceFreeMemory", memory)

    def mtmlMemoryGetTotal(self, memory: Any, total: Any) -> int:
        status, card = self._gate("mtmlMemoryGetTotal", memory, _MEMORY)
        if status == 0 and card is not None:
            put(total, card.memory_total_mib * _MIB)
        return status

    def mtmlMemoryGetUsed(self, memory: Any, used: Any) -> int:
        status, card = self._gate("mtmlMemoryGetUsed", memory, _MEMORY)
        if status == 0 and card is not None:
            put(used, card.memory_used_mib * _MIB)
        return status

    def mtmlDeviceInitGpu(self, device: Any, gpu: Any) -> int:
        status, _ = self._gate("mtmlDeviceInitGpu", device, _DEVICE)
        return status or self._open(gpu, _GPU + handle_value(device) - _DEVICE)

    def mtmlDeviceFreeGpu(self, gpu: Any) -> int:
        return self._free("mtmlDeviceFreeGpu", gpu)

    def mtmlGpuGetUtilization(self, gpu: Any, util: Any) -> int:
        status, card = self._gate("mtmlGpuGetUtilization", gpu, _GPU)
        if status == 0 and card is not None:
            put(util, card.utilization_percent)
        return status

    def mtmlGpuGetTemperature(self, gpu: Any, temp: Any) -> int:
        status, card = self._gate("mtmlGpuGetTemperature", gpu, _GPU)
        if status == 0 and card is not None:
            put(temp, card.temperature_c)
        return status

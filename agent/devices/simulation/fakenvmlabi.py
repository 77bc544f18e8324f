"""A simulated NVML clone: ``libixml.so`` (``nvml*`` names) or ``libhgml.so`` (``hgml*``).

The C functions are resolved by name: ``<prefix><Call>`` maps to the method ``_<Call>`` (with
the clone's word for "Cuda" normalised), so one simulator answers both prefixes and a name
the real library would not export raises ``AttributeError`` as ``ctypes.CDLL`` does. Device
handles are ``c_void_p`` values (card position + 1). Units are NVML's: bytes, mW, °C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.devices.libs import nvmlabi
from agent.devices.simulation.fakelib import (
    SimulatedLibrary,
    handle_value,
    plain,
    put,
    put_handle,
    put_text,
    written,
)
from agent.devices.simulation.profiles import CloneCard, CloneHost

_MIB = 1 << 20
_INVALID = 2
_INSUFFICIENT_SIZE = 7


class SimulatedNvmlAbi(SimulatedLibrary):
    CODES = nvmlabi.CODES
    LOST = "GPU_IS_LOST"
    UNINITIALIZED = "UNINITIALIZED"

    def __init__(self, host: CloneHost, prefix: str, cuda: str) -> None:
        super().__init__(host.init_error, [c.faults for c in host.cards])
        self.host = host
        self.prefix = prefix
        self.cuda = cuda

    def __getattr__(self, name: str) -> Callable[..., int]:
        if not name.startswith(self.prefix) or name.startswith("_"):
            raise AttributeError(name)
        call = name[len(self.prefix) :].replace(self.cuda, "Cuda")
        method = getattr(type(self), f"_{call}", None)
        if method is None:
            raise AttributeError(name)

        def bound(*args: Any) -> int:
            result: int = method(self, name, *(plain(a) for a in args))
            return result

        return bound

    def _gate(self, name: str, handle: Any) -> tuple[int, CloneCard | None]:
        value = handle_value(handle)
        if not 0 < value <= len(self.host.cards):
            self.calls.append((name, None))
            return _INVALID, None
        return self._card(name, value - 1), self.host.cards[value - 1]

    # -- system --------------------------------------------------------------------------------

    def _InitWithFlags(self, name: str, flags: int) -> int:
        return self._init(name)

    def _Shutdown(self, name: str) -> int:
        self.calls.append((name, None))
        self.initialized = False
        return 0

    def _SystemGetDriverVersion(self, name: str, buffer: Any, size: int) -> int:
        status = self._system(name)
        if status:
            return status
        return _INSUFFICIENT_SIZE if put_text(buffer, self.host.driver_version, size) else 0

    def _SystemGetCudaDriverVersion(self, name: str, value: Any) -> int:
        status = self._system(name)
        if status or self.host.runtime_version is None:
            return status or nvmlabi.NOT_SUPPORTED
        put(value, self.host.runtime_version)
        return 0

    def _DeviceGetCount_v2(self, name: str, count: Any) -> int:
        status = self._system(name)
        if status == 0:
            put(count, len(self.host.cards))
        return status

    def _DeviceGetHandleByIndex_v2(self, name: str, index: int, handle: Any) -> int:
        if not 0 <= index < len(self.host.cards):
            self.calls.append((name, None))
            return _INVALID
        status = self._card(name, index)
        if status == 0:
            put_handle(handle, index + 1)
        return status

    # -- per card ------------------------------------------------------------------------------

    def _DeviceGetUUID(self, name: str, h: Any, buffer: Any, size: int) -> int:
        status, card = self._gate(name, h)
        if status or card is None:
            return status
        return _INSUFFICIENT_SIZE if put_text(buffer, card.uuid, size) else 0

    def _DeviceGetName(self, name: str, h: Any, buffer: Any, size: int) -> int:
        status, card = self._gate(name, h)
        if status or card is None:
            return status
        return _INSUFFICIENT_SIZE if put_text(buffer, card.name, size) else 0

    def _DeviceGetMinorNumber(self, name: str, h: Any, minor: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            if card.minor is None:
                return nvmlabi.NOT_SUPPORTED
            put(minor, card.minor)
        return status

    def _DeviceGetPciInfo_v3(self, name: str, h: Any, info: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            out = written(info, "nvmlPciInfo_t")
            domain, bus, rest = card.bus_id.split(":")
            out.domain, out.bus = int(domain, 16), int(bus, 16)
            out.device = int(rest.split(".")[0], 16)
            out.busIdLegacy = card.bus_id.upper().encode()
            out.busId = f"0000{card.bus_id.upper()}".encode()
        return status

    def _DeviceGetMemoryInfo(self, name: str, h: Any, info: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            out = written(info, "nvmlMemory_t")
            out.total = card.memory_total_mib * _MIB
            out.used = card.memory_used_mib * _MIB
            out.free = out.total - out.used
        return status

    def _DeviceGetNumGpuCores(self, name: str, h: Any, cores: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            if card.gpu_cores is None:
                return nvmlabi.NOT_SUPPORTED
            put(cores, card.gpu_cores)
        return status

    def _DeviceGetCudaComputeCapability(self, name: str, h: Any, major: Any, minor: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            if card.compute_capability is None:
                return nvmlabi.NOT_SUPPORTED
            put(major, card.compute_capability[0])
            put(minor, card.compute_capability[1])
        return status

    def _DeviceGetUtilizationRates(self, name: str, h: Any, info: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            written(info, "nvmlUtilization_t").gpu = card.utilization_percent
        return status

    def _DeviceGetTemperature(self, name: str, h: Any, sensor: int, temp: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            put(temp, card.temperature_c)
        return status

    def _DeviceGetPowerUsage(self, name: str, h: Any, power: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            if card.power_mw is None:
                return nvmlabi.NOT_SUPPORTED
            put(power, card.power_mw)
        return status

    def _DeviceGetMigMode(self, name: str, h: Any, current: Any, pending: Any) -> int:
        status, card = self._gate(name, h)
        if status == 0 and card is not None:
            put(current, int(card.mig_mode))
            put(pending, int(card.mig_mode))
        return status

    def _DeviceGetGpuInstanceProfileInfo(self, name: str, h: Any, profile: int, info: Any) -> int:
        status, card = self._gate(name, h)
        if status or card is None:
            return status
        if not card.mig_mode:
            return nvmlabi.NOT_SUPPORTED
        found = next((p for p in card.mig_profiles if p.id == profile), None)
        if found is None:
            return nvmlabi.NOT_SUPPORTED
        out = written(info, "nvmlGpuInstanceProfileInfo_t")
        out.id, out.sliceCount, out.instanceCount = (
            found.id,
            found.slice_count,
            found.instance_count,
        )
        out.multiprocessorCount, out.memorySizeMB = found.multiprocessor_count, found.memory_mib
        return 0

    def _DeviceGetGpuInstancePossiblePlacements_v2(
        self, name: str, h: Any, profile: int, array: Any, count: Any
    ) -> int:
        status, card = self._gate(name, h)
        if status or card is None:
            return status
        found = next((p for p in card.mig_profiles if p.id == profile), None)
        if found is None:
            return nvmlabi.NOT_SUPPORTED
        if array is not None:
            for i, start in enumerate(found.placement_starts):
                array[i].start, array[i].size = start, found.placement_size
        put(count, len(found.placement_starts))
        return 0


def iluvatar(host: CloneHost) -> SimulatedNvmlAbi:
    return SimulatedNvmlAbi(host, "nvml", "Cuda")


def thead(host: CloneHost) -> SimulatedNvmlAbi:
    return SimulatedNvmlAbi(host, "hgml", "Hggc")

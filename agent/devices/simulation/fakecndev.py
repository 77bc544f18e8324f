"""A simulated ``libcndev.so`` built from a profile's ``cambricon`` section.

CNDev's traps are reproduced: a versioned structure whose ``version`` is not stamped answers
``UNSUPPORTED_API_VERSION``; handles are ints that are *not* the index (index + 100 here, so
mixing them up is caught); the UUID comes bare with a trailing NUL; a host with ``nameStrings:
false`` lacks ``cndevGetCardNameStringByDevId`` (``AttributeError``, as ``ctypes.CDLL`` raises).
"""

from __future__ import annotations

from typing import Any

from agent.devices.libs import cndev
from agent.devices.simulation.fakelib import SimulatedLibrary, target, written
from agent.devices.simulation.profiles import CambriconCard, CambriconHost

_BASE = 100
_UNSUPPORTED_API_VERSION = 3
_INVALID_DEVICE_ID = 6


class SimulatedCndev(SimulatedLibrary):
    CODES = cndev.CODES
    LOST = "IN_PROBLEM"
    UNINITIALIZED = "UNINITIALIZED"

    def __init__(self, host: CambriconHost) -> None:
        super().__init__(host.init_error, [c.faults for c in host.cards])
        self.host = host

    def __getattr__(self, name: str) -> Any:
        if name == "cndevGetCardNameStringByDevId" and self.host.name_strings:
            return self._name_string
        raise AttributeError(name)

    def _gate(self, name: str, handle: int, struct: Any = None) -> tuple[int, CambriconCard | None]:
        position = handle - _BASE
        if not 0 <= position < len(self.host.cards):
            self.calls.append((name, None))
            return _INVALID_DEVICE_ID, None
        status = self._card(name, position)
        if status == 0 and struct is not None and target(struct).version != cndev.STRUCT_VERSION:
            return _UNSUPPORTED_API_VERSION, None
        return status, self.host.cards[position]

    def cndevInit(self, reserved: int) -> int:
        return self._init("cndevInit")

    def cndevRelease(self) -> int:
        self.calls.append(("cndevRelease", None))
        self.initialized = False
        return 0

    def cndevGetDeviceCount(self, info: Any) -> int:
        status = self._system("cndevGetDeviceCount")
        if status == 0:
            if target(info).version != cndev.STRUCT_VERSION:
                return _UNSUPPORTED_API_VERSION
            written(info, "cndevCardInfo_t").number = len(self.host.cards)
        return status

    def cndevGetDeviceHandleByIndex(self, index: int, handle: Any) -> int:
        status, _ = self._gate("cndevGetDeviceHandleByIndex", index + _BASE)
        if status == 0:
            target(handle).value = index + _BASE
        return status

    def cndevGetUUID(self, info: Any, handle: int) -> int:
        status, card = self._gate("cndevGetUUID", handle, info)
        if status == 0 and card is not None:
            written(info, "cndevUUID_t").uuid = card.uuid.encode()[:36] + b"\x00"
        return status

    def _name_string(self, handle: int) -> bytes | None:
        status, card = self._gate("cndevGetCardNameStringByDevId", handle)
        return card.name.encode() if status == 0 and card is not None else None

    def cndevGetCardName(self, info: Any, handle: int) -> int:
        status, card = self._gate("cndevGetCardName", handle, info)
        if status == 0 and card is not None:
            written(info, "cndevCardName_t").id = card.name_id
        return status

    def cndevGetPCIeInfoV2(self, info: Any, handle: int) -> int:
        status, card = self._gate("cndevGetPCIeInfoV2", handle)
        if status == 0 and card is not None:
            domain, bus, rest = card.bus_id.split(":")
            dev, fn = rest.split(".")
            out = written(info, "cndevPCIeInfoV2_t")
            out.domain, out.bus, out.device, out.function = (
                int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16),
            )  # fmt: skip
            out.vendor, out.deviceId = 0xCABC, card.pci_device_id
        return status

    def cndevGetVersionInfo(self, info: Any, handle: int) -> int:
        status, card = self._gate("cndevGetVersionInfo", handle, info)
        if status == 0 and card is not None:
            out = written(info, "cndevVersionInfo_t")
            major, minor, build = card.driver_version
            out.driverMajorVersion, out.driverMinorVersion, out.driverBuildVersion = (
                major, minor, build,
            )  # fmt: skip
        return status

    def cndevGetMemoryUsageV2(self, info: Any, handle: int) -> int:
        status, card = self._gate("cndevGetMemoryUsageV2", handle)
        if status == 0 and card is not None:
            out = written(info, "cndevMemoryInfoV2_t")
            out.physicalMemoryTotal, out.physicalMemoryUsed = (
                card.memory_total_mib, card.memory_used_mib,
            )  # fmt: skip
        return status

    def cndevGetDeviceUtilizationInfo(self, info: Any, handle: int) -> int:
        status, card = self._gate("cndevGetDeviceUtilizationInfo", handle, info)
        if status == 0 and card is not None:
            written(
                info, "cndevUtilizationInfo_t"
            ).averageCoreUtilization = card.utilization_percent
        return status

    def cndevGetTemperatureInfo(self, info: Any, handle: int) -> int:
        status, card = self._gate("cndevGetTemperatureInfo", handle, info)
        if status == 0 and card is not None:
            written(info, "cndevTemperatureInfo_t").chip = card.chip_temperature_c
        return status

    def cndevGetDevicePowerInfo(self, info: Any, handle: int) -> int:
        status, card = self._gate("cndevGetDevicePowerInfo", handle)
        if status == 0 and card is not None:
            written(info, "cndevDevicePowerInfo_t").usage = card.power_w
        return status

"""The CNDev adapter: the one module that calls Cambricon's ``libcndev.so`` (MLUs).

Traps kept in mind: most CNDev structures start with an ``int version`` the caller must stamp,
or the call answers ``UNSUPPORTED_API_VERSION`` (the newer ``…V2`` structures and the power one
have none); a device handle is an ``int`` obtained by index; the UUID comes bare (tools print
``MLU-`` before it) and old drivers append a NUL. Memory is "MB" in the header and MiB in
practice (what ``cnmon`` shows), power is W, temperature °C.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any

from agent.devices import pci
from agent.devices.libs import clib


def candidates(env: Mapping[str, str]) -> tuple[str, ...]:
    """The loader path, then ``$NEUWARE_HOME`` (default ``/usr/local/neuware``) ``lib64``, ``lib``:
    gpustack-runtime's and the reference's order."""
    home = env.get("NEUWARE_HOME") or "/usr/local/neuware"
    return ("libcndev.so", f"{home}/lib64/libcndev.so", f"{home}/lib/libcndev.so")


CANDIDATES = candidates({})
LIBRARY = "CNDev (libcndev.so)"
STRUCT_VERSION = 6
"""``CNDEV_VERSION_6``, stamped into every versioned structure."""

NOT_SUPPORTED = 10
IN_PROBLEM = 18
CODES = clib.Codes(
    names={
        1: "NO_DRIVER",
        2: "LOW_DRIVER_VERSION",
        3: "UNSUPPORTED_API_VERSION",
        4: "UNINITIALIZED",
        5: "INVALID_ARGUMENT",
        6: "INVALID_DEVICE_ID",
        7: "UNKNOWN",
        8: "MALLOC",
        9: "INSUFFICIENT_SPACE",
        NOT_SUPPORTED: "NOT_SUPPORTED",
        11: "INVALID_LINK",
        12: "NO_DEVICES",
        13: "NO_PERMISSION",
        14: "NOT_FOUND",
        15: "IN_USE",
        16: "DUPLICATE",
        17: "TIMEOUT",
        IN_PROBLEM: "IN_PROBLEM",
    },
    unsupported=frozenset({NOT_SUPPORTED, 3, 13}),
    lost=frozenset({IN_PROBLEM}),
    unavailable=frozenset({1}),
)

NAMES = {
    0: "MLU100", 1: "MLU270", 16: "MLU220", 17: "MLU220", 18: "MLU220", 19: "MLU220",
    20: "MLU290", 23: "MLU370", 24: "MLU365", 25: "CE3226", 26: "MLU590", 27: "MLU585",
    30: "MLU580", 31: "MLU570",
}  # fmt: skip
"""``cndevNameEnum_t`` → product, for drivers without the name-string calls."""


class CardInfo(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("number", ctypes.c_uint)]


class Uuid(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int),
        ("uuid", ctypes.c_char * 37),
        ("ncsUUID64", ctypes.c_ulonglong),
    ]


class CardName(ctypes.Structure):
    _fields_ = [("version", ctypes.c_int), ("id", ctypes.c_int)]


class MemoryInfoV2(ctypes.Structure):
    """``cndevMemoryInfoV2_t``: 176 bytes, the library writes the trailing reserved words too."""

    _fields_ = [
        ("physicalMemoryTotal", ctypes.c_longlong),
        ("physicalMemoryUsed", ctypes.c_longlong),
        ("reservedMemory", ctypes.c_longlong),
        ("virtualMemoryTotal", ctypes.c_longlong),
        ("virtualMemoryUsed", ctypes.c_longlong),
        ("globalMemory", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong * 16),
    ]


class PcieInfoV2(ctypes.Structure):
    """``cndevPCIeInfoV2_t``: 64 bytes, the library writes the trailing reserved words too."""

    _fields_ = [
        ("subsystemId", ctypes.c_uint),
        ("deviceId", ctypes.c_uint),
        ("vendor", ctypes.c_ushort),
        ("subsystemVendor", ctypes.c_ushort),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("function", ctypes.c_uint),
        ("moduleId", ctypes.c_ushort),
        ("slotId", ctypes.c_ushort),
        ("reserved", ctypes.c_uint * 8),
    ]


class VersionInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int),
        ("mcuMajorVersion", ctypes.c_uint),
        ("mcuMinorVersion", ctypes.c_uint),
        ("mcuBuildVersion", ctypes.c_uint),
        ("driverMajorVersion", ctypes.c_uint),
        ("driverMinorVersion", ctypes.c_uint),
        ("driverBuildVersion", ctypes.c_uint),
    ]


class UtilizationInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int),
        ("averageCoreUtilization", ctypes.c_int),
        ("coreUtilization", ctypes.c_int * 80),
    ]


class TemperatureInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_int),
        ("board", ctypes.c_int),
        ("cluster", ctypes.c_int * 20),
        ("memoryDie", ctypes.c_int * 8),
        ("chip", ctypes.c_int),
        ("airInlet", ctypes.c_int),
        ("airOutlet", ctypes.c_int),
        ("memory", ctypes.c_int),
        ("videoInput", ctypes.c_int),
        ("cpu", ctypes.c_int),
        ("isp", ctypes.c_int),
    ]


class PowerInfo(ctypes.Structure):
    _fields_ = [
        ("usage", ctypes.c_int),
        ("cap", ctypes.c_int),
        ("machine", ctypes.c_int),
        ("tdp", ctypes.c_int),
        ("maxPower", ctypes.c_int),
        ("reserved", ctypes.c_int * 16),
    ]


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, candidates(os.environ), CODES)


def _stamped(struct: type[ctypes.Structure]) -> Any:
    made = struct()
    made.version = STRUCT_VERSION
    return made


class Cndev(clib.Binding):
    def __init__(self, library: Any) -> None:
        super().__init__(library, CODES, returns={"cndevGetCardNameStringByDevId": ctypes.c_char_p})

    def init(self) -> None:
        self.call("cndevInit", 0)

    def release(self) -> None:
        self.call("cndevRelease")

    def device_count(self) -> int:
        info = _stamped(CardInfo)
        self.call("cndevGetDeviceCount", ctypes.byref(info))
        return int(info.number)

    def handle(self, index: int) -> int:
        handle = ctypes.c_int(0)
        self.call("cndevGetDeviceHandleByIndex", index, ctypes.byref(handle))
        return handle.value

    def uuid(self, h: int) -> str:
        """``MLU-`` and the bare UUID (NULs stripped); empty when the driver gave none."""
        info = _stamped(Uuid)
        self.call("cndevGetUUID", ctypes.byref(info), h)
        bare = clib.text(info.uuid)
        return f"MLU-{bare}" if bare else ""

    def name(self, h: int) -> str:
        """The product string; older drivers only give an enum, named from :data:`NAMES`."""
        try:
            return clib.text(self.value("cndevGetCardNameStringByDevId", h))
        except clib.LibUnsupported:
            info = _stamped(CardName)
            self.call("cndevGetCardName", ctypes.byref(info), h)
            return NAMES.get(int(info.id), "")

    def pci_bus_id(self, h: int) -> str:
        info = PcieInfoV2()
        self.call("cndevGetPCIeInfoV2", ctypes.byref(info), h)
        return pci.normalize_bdf(
            f"{info.domain:04x}:{info.bus:02x}:{info.device:02x}.{info.function:x}"
        )

    def driver_version(self, h: int) -> str:
        info = _stamped(VersionInfo)
        self.call("cndevGetVersionInfo", ctypes.byref(info), h)
        return f"{info.driverMajorVersion}.{info.driverMinorVersion}.{info.driverBuildVersion}"

    def memory(self, h: int) -> tuple[int, int]:
        """``(total, used)`` MiB (the header's "MB")."""
        info = MemoryInfoV2()
        self.call("cndevGetMemoryUsageV2", ctypes.byref(info), h)
        return int(info.physicalMemoryTotal), int(info.physicalMemoryUsed)

    def utilization(self, h: int) -> int:
        info = _stamped(UtilizationInfo)
        self.call("cndevGetDeviceUtilizationInfo", ctypes.byref(info), h)
        return int(info.averageCoreUtilization)

    def temperature(self, h: int) -> int:
        """The chip sensor, °C."""
        info = _stamped(TemperatureInfo)
        self.call("cndevGetTemperatureInfo", ctypes.byref(info), h)
        return int(info.chip)

    def power(self, h: int) -> int:
        """Power drawn, W."""
        info = PowerInfo()
        self.call("cndevGetDevicePowerInfo", ctypes.byref(info), h)
        return int(info.usage)

"""The NVML-shaped C interface that Iluvatar's IXML and T-Head's HGML both re-implement.

IXML exports NVML's own symbol names (``nvmlDeviceGetCount_v2``) from ``libixml.so``; HGML
exports the same calls with an ``hgml`` prefix and "Hggc" for "Cuda". Both keep NVML's status
codes, structure layouts and units (bytes, mW, °C). :class:`NvmlAbi` binds the calls once for a
given prefix; the adapters :mod:`agent.devices.libs.ixml` and :mod:`agent.devices.libs.hgml` say which
library, prefix and names. Each library is opened privately (``RTLD_LOCAL``), never as
``pynvml``, so these symbols cannot collide with NVIDIA's.
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.devices import pci
from agent.devices.libs import clib

# NVML status codes (nvml.h), which both clones keep.
NOT_SUPPORTED = 3
GPU_IS_LOST = 15
CODES = clib.Codes(
    names={
        1: "UNINITIALIZED",
        2: "INVALID_ARGUMENT",
        NOT_SUPPORTED: "NOT_SUPPORTED",
        4: "NO_PERMISSION",
        5: "ALREADY_INITIALIZED",
        6: "NOT_FOUND",
        7: "INSUFFICIENT_SIZE",
        9: "DRIVER_NOT_LOADED",
        10: "TIMEOUT",
        12: "LIBRARY_NOT_FOUND",
        13: "FUNCTION_NOT_FOUND",
        GPU_IS_LOST: "GPU_IS_LOST",
        17: "OPERATING_SYSTEM",
        999: "UNKNOWN",
    },
    unsupported=frozenset({NOT_SUPPORTED, 4, 13}),
    lost=frozenset({GPU_IS_LOST}),
    unavailable=frozenset({9, 12}),
)
TEMPERATURE_GPU = 0
GI_PROFILE_LAST = 0x9
"""Highest GPU-instance profile id that is a compute partition (``0xA``-``0xE`` are copy-engine
profiles, which are not partitions a pod can ask for)."""


class PciInfo(ctypes.Structure):
    """``nvmlPciInfo_t`` (v3 layout)."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class GpuInstanceProfileInfo(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint),
        ("isP2pSupported", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("copyEngineCount", ctypes.c_uint),
        ("decoderCount", ctypes.c_uint),
        ("encoderCount", ctypes.c_uint),
        ("jpegCount", ctypes.c_uint),
        ("ofaCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
    ]


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class NvmlAbi(clib.Binding):
    """NVML-shaped calls under ``prefix`` (``nvml`` or ``hgml``), returning plain values.

    ``cuda`` is what the clone calls CUDA in symbol names (``Cuda`` for IXML, ``Hggc`` for HGML).
    """

    def __init__(self, library: Any, prefix: str, cuda: str) -> None:
        super().__init__(library, CODES)
        self.prefix = prefix
        self.cuda = cuda

    def _c(self, name: str, *args: Any) -> None:
        self.call(self.prefix + name, *args)

    def init(self) -> None:
        self._c("InitWithFlags", 0)

    def shutdown(self) -> None:
        self._c("Shutdown")

    def driver_version(self) -> str:
        buf = ctypes.create_string_buffer(80)
        self._c("SystemGetDriverVersion", buf, 80)
        return clib.text(buf)

    def runtime_version(self) -> int:
        """The CUDA-style runtime the driver supports: ``major*1000 + minor*10``."""
        value = ctypes.c_int(0)
        self._c(f"SystemGet{self.cuda}DriverVersion", ctypes.byref(value))
        return value.value

    def device_count(self) -> int:
        count = ctypes.c_uint(0)
        try:
            self._c("DeviceGetCount_v2", ctypes.byref(count))
        except clib.LibUnsupported:
            self._c("DeviceGetCount", ctypes.byref(count))
        return count.value

    def handle(self, index: int) -> Any:
        handle = ctypes.c_void_p(None)
        try:
            self._c("DeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
        except clib.LibUnsupported:
            self._c("DeviceGetHandleByIndex", index, ctypes.byref(handle))
        return handle

    def uuid(self, h: Any) -> str:
        buf = ctypes.create_string_buffer(96)
        self._c("DeviceGetUUID", h, buf, 96)
        return clib.text(buf)

    def name(self, h: Any) -> str:
        buf = ctypes.create_string_buffer(96)
        self._c("DeviceGetName", h, buf, 96)
        return clib.text(buf)

    def minor_number(self, h: Any) -> int:
        minor = ctypes.c_uint(0)
        self._c("DeviceGetMinorNumber", h, ctypes.byref(minor))
        return minor.value

    def pci_bus_id(self, h: Any) -> str:
        """``dddd:bb:dd.f`` lowercase: ``busIdLegacy`` (4-digit domain) first, as sysfs has it."""
        info = PciInfo()
        try:
            self._c("DeviceGetPciInfo_v3", h, ctypes.byref(info))
        except clib.LibUnsupported:
            self._c("DeviceGetPciInfo", h, ctypes.byref(info))
        raw = clib.text(info.busIdLegacy) or clib.text(info.busId)
        if raw:
            return pci.normalize_bdf(raw)
        return f"{info.domain:04x}:{info.bus:02x}:{info.device:02x}.0"

    def memory(self, h: Any) -> tuple[int, int]:
        """``(total, used)`` bytes."""
        info = Memory()
        self._c("DeviceGetMemoryInfo", h, ctypes.byref(info))
        return int(info.total), int(info.used)

    def num_cores(self, h: Any) -> int:
        cores = ctypes.c_uint(0)
        self._c("DeviceGetNumGpuCores", h, ctypes.byref(cores))
        return cores.value

    def compute_capability(self, h: Any) -> tuple[int, int]:
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        name = f"DeviceGet{self.cuda}ComputeCapability"
        self._c(name, h, ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def utilization(self, h: Any) -> int:
        info = Utilization()
        self._c("DeviceGetUtilizationRates", h, ctypes.byref(info))
        return int(info.gpu)

    def temperature(self, h: Any) -> int:
        temp = ctypes.c_uint(0)
        self._c("DeviceGetTemperature", h, TEMPERATURE_GPU, ctypes.byref(temp))
        return temp.value

    def power_usage(self, h: Any) -> int:
        """Power drawn, mW."""
        power = ctypes.c_uint(0)
        self._c("DeviceGetPowerUsage", h, ctypes.byref(power))
        return power.value

    # -- partitions (HGML's MIG) ----------------------------------------------------------------

    def mig_mode(self, h: Any) -> bool:
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        self._c("DeviceGetMigMode", h, ctypes.byref(current), ctypes.byref(pending))
        return bool(current.value)

    def gpu_instance_profiles(self, h: Any) -> list[tuple[GpuInstanceProfileInfo, int, int]]:
        """``(info, first placement size, placements)`` of each compute profile the card has."""
        found = []
        for profile in range(GI_PROFILE_LAST + 1):
            info = GpuInstanceProfileInfo()
            try:
                self._c("DeviceGetGpuInstanceProfileInfo", h, profile, ctypes.byref(info))
            except clib.LibError as e:
                if isinstance(e, clib.LibLost):
                    raise
                continue  # a profile this card does not offer
            size, count = self._placements(h, int(info.id))
            found.append((info, size, count))
        return found

    def _placements(self, h: Any, profile_id: int) -> tuple[int, int]:
        count = ctypes.c_uint(0)
        name = "DeviceGetGpuInstancePossiblePlacements_v2"
        self._c(name, h, profile_id, None, ctypes.byref(count))
        if count.value == 0:
            return 0, 0
        array = (Placement * count.value)()
        self._c(name, h, profile_id, array, ctypes.byref(count))
        return int(array[0].size), count.value

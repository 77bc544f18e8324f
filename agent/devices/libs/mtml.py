"""The MTML adapter: the one module that calls Moore Threads' ``libmtml.so`` (MUSA GPUs).

MTML is object-based: a library handle, then a system handle (driver version), device handles
by index, and per-device memory and GPU sub-handles. Every ``Init*`` is paired with its
``Free*`` here, sub-handles before their device (freeing the device first and then using it,
as one detector does, is undefined behaviour). Units: bytes, **mW**, °C. MTML has no power
limit, compute capability or MUSA version call; none is invented.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agent.devices import pci
from agent.devices.libs import clib

CANDIDATES = ("libmtml.so.2", "libmtml.so")
"""The loader path only: current MUSA installs ship the versioned soname, older ones the bare."""
LIBRARY = "MTML (libmtml.so)"

DRIVER_FAILURE = 2
NOT_SUPPORTED = 4
CODES = clib.Codes(
    names={
        1: "DRIVER_NOT_LOADED",
        DRIVER_FAILURE: "DRIVER_FAILURE",
        3: "INVALID_ARGUMENT",
        NOT_SUPPORTED: "NOT_SUPPORTED",
        5: "NO_PERMISSION",
        6: "INSUFFICIENT_SIZE",
        7: "NOT_FOUND",
        8: "INSUFFICIENT_MEMORY",
        9: "DRIVER_TOO_OLD",
        10: "DRIVER_TOO_NEW",
        11: "TIMEOUT",
        12: "RESOURCE_IS_BUSY",
        666: "UNINITIALIZED",
        999: "UNKNOWN",
    },
    unsupported=frozenset({NOT_SUPPORTED, 5}),
    lost=frozenset({DRIVER_FAILURE}),
    unavailable=frozenset({1}),
)


class PciInfo(ctypes.Structure):
    """``MtmlPciInfo``: 104 bytes with its six reserved ints, all written by the library."""

    _fields_ = [
        ("sbdf", ctypes.c_char * 32),
        ("segment", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubsystemId", ctypes.c_uint),
        ("busWidth", ctypes.c_uint),
        ("pciMaxSpeed", ctypes.c_float),
        ("pciCurSpeed", ctypes.c_float),
        ("pciMaxWidth", ctypes.c_uint),
        ("pciCurWidth", ctypes.c_uint),
        ("pciMaxGen", ctypes.c_uint),
        ("pciCurGen", ctypes.c_uint),
        ("rsvd", ctypes.c_int * 6),
    ]


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, CANDIDATES, CODES)


class Mtml(clib.Binding):
    def __init__(self, library: Any) -> None:
        super().__init__(library, CODES)
        self._lib: Any = None

    def init(self) -> None:
        lib = ctypes.c_void_p(None)
        self.call("mtmlLibraryInit", ctypes.byref(lib))
        self._lib = lib

    def shutdown(self) -> None:
        lib, self._lib = self._lib, None
        if lib is not None:
            self.call("mtmlLibraryShutDown", lib)

    def driver_version(self) -> str:
        system = ctypes.c_void_p(None)
        self.call("mtmlLibraryInitSystem", self._lib, ctypes.byref(system))
        try:
            buf = ctypes.create_string_buffer(80)
            self.call("mtmlSystemGetDriverVersion", system, buf, 80)
            return clib.text(buf)
        finally:
            self.call("mtmlLibraryFreeSystem", system)

    def device_count(self) -> int:
        count = ctypes.c_uint(0)
        self.call("mtmlLibraryCountDevice", self._lib, ctypes.byref(count))
        return count.value

    def device(self, index: int) -> Any:
        """A device handle; free it with :meth:`free_device` once its sub-handles are freed."""
        device = ctypes.c_void_p(None)
        self.call("mtmlLibraryInitDeviceByIndex", self._lib, index, ctypes.byref(device))
        return device

    def free_device(self, device: Any) -> None:
        self.call("mtmlLibraryFreeDevice", device)

    def uuid(self, device: Any) -> str:
        buf = ctypes.create_string_buffer(48)
        self.call("mtmlDeviceGetUUID", device, buf, 48)
        return clib.text(buf)

    def name(self, device: Any) -> str:
        buf = ctypes.create_string_buffer(32)
        self.call("mtmlDeviceGetName", device, buf, 32)
        return clib.text(buf)

    def pci_bus_id(self, device: Any) -> str:
        """The ``sbdf`` string (it keeps the function number), normalised."""
        info = PciInfo()
        self.call("mtmlDeviceGetPciInfo", device, ctypes.byref(info))
        raw = clib.text(info.sbdf)
        return pci.normalize_bdf(raw or f"{info.segment:04x}:{info.bus:02x}:{info.device:02x}.0")

    def gpu_cores(self, device: Any) -> int:
        cores = ctypes.c_uint(0)
        self.call("mtmlDeviceCountGpuCores", device, ctypes.byref(cores))
        return cores.value

    def power_mw(self, device: Any) -> int:
        power = ctypes.c_uint(0)
        self.call("mtmlDeviceGetPowerUsage", device, ctypes.byref(power))
        return power.value

    @contextmanager
    def _sub(self, kind: str, device: Any) -> Iterator[Any]:
        handle = ctypes.c_void_p(None)
        self.call(f"mtmlDeviceInit{kind}", device, ctypes.byref(handle))
        try:
            yield handle
        finally:
            self.call(f"mtmlDeviceFree{kind}", handle)

    def memory(self, device: Any) -> tuple[int, int]:
        """``(total, used)`` bytes."""
        total, used = ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
        with self._sub("Memory", device) as memory:
            self.call("mtmlMemoryGetTotal", memory, ctypes.byref(total))
            self.call("mtmlMemoryGetUsed", memory, ctypes.byref(used))
        return total.value, used.value

    def gpu(self, device: Any) -> tuple[int, int]:
        """``(utilization %, temperature °C)``."""
        util, temp = ctypes.c_uint(0), ctypes.c_uint(0)
        with self._sub("Gpu", device) as gpu:
            self.call("mtmlGpuGetUtilization", gpu, ctypes.byref(util))
            self.call("mtmlGpuGetTemperature", gpu, ctypes.byref(temp))
        return util.value, temp.value

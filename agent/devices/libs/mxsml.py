"""The MXSML adapter: the one module that calls MetaX's ``libmxsml.so``.

Devices are plain ids ``0..count-1`` (no handles), and the count is the *return value* of
``mxSmlGetDeviceCount``, not a status. Three scalings in one library: memory in **KB** (KiB),
temperature in **°C × 100**, power in **mW** summed over the board's supply "ways" (whose
count is negotiated with a first call answering ``INSUFFICIENT_SIZE``).

Candidates are gpustack-runtime's fixed install directories in its order, then the loader path
(where gpustack-runtime walks all of ``/opt`` instead: slow on a big tree, so not done here).
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.devices import pci
from agent.devices.libs import clib

CANDIDATES = (
    "/opt/mxdriver/lib/libmxsml.so",
    "/opt/maca/lib/libmxsml.so",
    "/opt/mxn100/lib/libmxsml.so",
    "libmxsml.so",
)
LIBRARY = "MXSML (libmxsml.so)"

FAILURE = 1
NO_DEVICE = 2
NOT_SUPPORTED = 3
INSUFFICIENT_SIZE = 10
CODES = clib.Codes(
    names={
        FAILURE: "FAILURE",
        NO_DEVICE: "NO_DEVICE",
        NOT_SUPPORTED: "OPERATION_NOT_SUPPORTED",
        4: "SYSFS_ERROR",
        6: "INVALID_DEVICE_ID",
        8: "PERMISSION_DENIED",
        9: "INVALID_INPUT",
        INSUFFICIENT_SIZE: "INSUFFICIENT_SIZE",
        12: "IOCTL_FAILURE",
        23: "BUSY",
        26: "LOAD_DLL_FAILURE",
    },
    unsupported=frozenset({NOT_SUPPORTED, 8}),
    lost=frozenset({NO_DEVICE}),
    unavailable=frozenset({26}),
)

VERSION_DRIVER = 1
TEMPERATURE_HOTSPOT = 0
USAGE_DLA = 0
USAGE_XCORE = 4
BRAND_N = 1
BRANDS = {1: "MXN", 2: "MXC", 3: "MXG"}
"""``mxSmlDeviceBrand_t`` → the product line as GPUStack and the products name it (``MXC500`` is
an MXC card): N-class inference, C-class compute, G-class graphics."""


class DeviceInfo(ctypes.Structure):
    _fields_ = [
        ("deviceId", ctypes.c_uint),
        ("type", ctypes.c_int),
        ("bdfId", ctypes.c_char * 32),
        ("gpuId", ctypes.c_uint),
        ("nodeId", ctypes.c_uint),
        ("uuid", ctypes.c_char * 96),
        ("brand", ctypes.c_int),
        ("mode", ctypes.c_int),
        ("deviceName", ctypes.c_char * 32),
    ]


class MemoryInfo(ctypes.Structure):
    _fields_ = [
        ("visVramTotal", ctypes.c_ulong),
        ("visVramUse", ctypes.c_ulong),
        ("vramTotal", ctypes.c_ulong),
        ("vramUse", ctypes.c_ulong),
        ("xttTotal", ctypes.c_ulong),
        ("xttUse", ctypes.c_ulong),
    ]


class BoardWay(ctypes.Structure):
    _fields_ = [("voltage", ctypes.c_uint), ("current", ctypes.c_uint), ("power", ctypes.c_uint)]


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, CANDIDATES, CODES)


class Mxsml(clib.Binding):
    def __init__(self, library: Any) -> None:
        super().__init__(library, CODES, returns={"mxSmlGetDeviceCount": ctypes.c_uint})

    def init(self) -> None:
        self.call("mxSmlInit")

    def maca_version(self) -> str:
        buf, size = ctypes.create_string_buffer(64), ctypes.c_uint(64)
        self.call("mxSmlGetMacaVersion", buf, ctypes.byref(size))
        return clib.text(buf)

    def device_count(self) -> int:
        return int(self.value("mxSmlGetDeviceCount"))

    def device_info(self, device: int) -> tuple[str, str, str, int]:
        """``(uuid, name, PCI address, brand)``."""
        info = DeviceInfo()
        self.call("mxSmlGetDeviceInfo", device, ctypes.byref(info))
        bdf = clib.text(info.bdfId)
        return (
            clib.text(info.uuid),
            clib.text(info.deviceName),
            pci.normalize_bdf(bdf) if bdf else "",
            int(info.brand),
        )

    def driver_version(self, device: int) -> str:
        buf, size = ctypes.create_string_buffer(64), ctypes.c_uint(64)
        self.call("mxSmlGetDeviceVersion", device, VERSION_DRIVER, buf, ctypes.byref(size))
        return clib.text(buf)

    def memory(self, device: int) -> tuple[int, int]:
        """``(total, used)`` MiB from the KB figures."""
        info = MemoryInfo()
        self.call("mxSmlGetMemoryInfo", device, ctypes.byref(info))
        return int(info.vramTotal) >> 10, int(info.vramUse) >> 10

    def temperature(self, device: int) -> int:
        """The hotspot sensor, °C (the library reports hundredths)."""
        value = ctypes.c_int(0)
        self.call("mxSmlGetTemperatureInfo", device, TEMPERATURE_HOTSPOT, ctypes.byref(value))
        return value.value // 100

    def power_mw(self, device: int) -> int:
        """Board power, mW: the sum over the board's supply ways."""
        size = ctypes.c_uint(0)
        name = "mxSmlGetBoardPowerInfo"
        status = int(self.function(name)(device, ctypes.byref(size), None))
        if status not in (0, INSUFFICIENT_SIZE):
            raise self.codes.error(name, status)
        ways = (BoardWay * max(size.value, 1))()
        self.call(name, device, ctypes.byref(size), ways)
        return sum(int(w.power) for w in ways[: size.value])

    def utilization(self, device: int, brand: int) -> int:
        """Compute-core use, %: XCORE on C-class parts, the DLA on N-class ones."""
        ip = USAGE_DLA if brand == BRAND_N else USAGE_XCORE
        value = ctypes.c_int(0)
        self.call("mxSmlGetDeviceIpUsage", device, ip, ctypes.byref(value))
        return value.value

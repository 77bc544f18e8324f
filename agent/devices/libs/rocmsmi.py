"""The ROCm SMI adapter for Hygon DCUs: the one module that calls DTK's ``librocm_smi64.so``.

Hygon ships a ROCm-derived stack (DTK, driver package "hyhal") whose management library is a
build of ROCm SMI; it is not HGML (that is T-Head's). Devices are indexes. Units: bytes, µW and
m°C, three scalings. The PCI id packs ``domain<<32 | bus<<8 | device<<3 | function`` with a
partition number in bits 28-31, which is masked off. Only Hygon's install paths are tried, and
the backend runs only behind the PCI check for Hygon's vendor id, so this never claims AMD cards.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any

from agent.devices.libs import clib

SONAME = "librocm_smi64.so"
HYGON_DIRS = (
    "/opt/hyhal/lib",
    "/opt/dtk/.hyhal/rocm_smi/lib",
    "/opt/dtk/rocm_smi/lib",
    "/opt/dtk/lib",
)
"""Where DTK and hyhal install the library when no environment variable points at it."""
LIBRARY = "ROCm SMI from DTK (librocm_smi64.so)"

NOT_SUPPORTED = 2
FILE_ERROR = 3
CODES = clib.Codes(
    names={
        1: "INVALID_ARGS",
        NOT_SUPPORTED: "NOT_SUPPORTED",
        FILE_ERROR: "FILE_ERROR",
        4: "PERMISSION",
        5: "OUT_OF_RESOURCES",
        6: "INTERNAL_EXCEPTION",
        7: "INPUT_OUT_OF_BOUNDS",
        8: "INIT_ERROR",
        9: "NOT_YET_IMPLEMENTED",
        10: "NOT_FOUND",
        11: "INSUFFICIENT_SIZE",
        14: "NO_DATA",
        16: "BUSY",
        0xFFFFFFFF: "UNKNOWN_ERROR",
    },
    unsupported=frozenset({NOT_SUPPORTED, 4, 9}),
    lost=frozenset({FILE_ERROR}),
    unavailable=frozenset({8}),
)

MEMORY_VRAM = 0
TEMPERATURE_CURRENT = 0
TEMPERATURE_SENSORS = (0, 1, 2)
"""Edge, junction, memory: the first that answers is reported."""


def candidates(env: Mapping[str, str]) -> tuple[str, ...]:
    """Where to look, in order: first what gpustack-runtime's binding tries, then Hygon's trees.

    The binding's order: ``$ROCM_SMI_LIB_PATH`` when set; else the ROCm home (``$ROCM_HOME``,
    else ``$ROCM_PATH``, else ``/opt/rocm``) under ``lib`` then ``rocm_smi/lib``. After those,
    the hyhal and DTK directories (bare and ``.1`` sonames: a host may carry only the versioned
    one), and last the loader path.
    """
    first: list[str] = []
    if env.get("ROCM_SMI_LIB_PATH"):
        first.append(os.path.join(env["ROCM_SMI_LIB_PATH"], SONAME))
    else:
        home = env.get("ROCM_HOME") or env.get("ROCM_PATH") or "/opt/rocm"
        first += [os.path.join(home, "lib", SONAME), os.path.join(home, "rocm_smi", "lib", SONAME)]
    found = [*first]
    for directory in HYGON_DIRS:
        found += [os.path.join(directory, SONAME), os.path.join(directory, SONAME + ".1")]
    found += [SONAME, SONAME + ".1"]
    return tuple(dict.fromkeys(found))


def load(env: Mapping[str, str] | None = None) -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, candidates(os.environ if env is None else env), CODES)


def decode_bdf(bdfid: int) -> str:
    """``rsmi_dev_pci_id_get``'s integer as ``dddd:bb:dd.f`` (partition bits 28-31 dropped)."""
    domain = bdfid >> 32 & 0xFFFFFFFF
    return f"{domain:04x}:{bdfid >> 8 & 0xFF:02x}:{bdfid >> 3 & 0x1F:02x}.{bdfid & 0x7:x}"


class RocmSmi(clib.Binding):
    def __init__(self, library: Any) -> None:
        super().__init__(library, CODES)

    def init(self) -> None:
        self.call("rsmi_init", ctypes.c_uint64(0))

    def shutdown(self) -> None:
        self.call("rsmi_shut_down")

    def device_count(self) -> int:
        count = ctypes.c_uint32(0)
        self.call("rsmi_num_monitor_devices", ctypes.byref(count))
        return count.value

    def unique_id(self, index: int) -> int:
        value = ctypes.c_uint64(0)
        self.call("rsmi_dev_unique_id_get", index, ctypes.byref(value))
        return value.value

    def pci_bus_id(self, index: int) -> str:
        value = ctypes.c_uint64(0)
        self.call("rsmi_dev_pci_id_get", index, ctypes.byref(value))
        return decode_bdf(value.value)

    def name(self, index: int) -> str:
        buf = ctypes.create_string_buffer(128)
        self.call("rsmi_dev_name_get", index, buf, ctypes.c_size_t(128))
        return clib.text(buf)

    def memory(self, index: int) -> tuple[int, int]:
        """``(total, used)`` VRAM bytes."""
        total, used = ctypes.c_uint64(0), ctypes.c_uint64(0)
        self.call("rsmi_dev_memory_total_get", index, MEMORY_VRAM, ctypes.byref(total))
        self.call("rsmi_dev_memory_usage_get", index, MEMORY_VRAM, ctypes.byref(used))
        return total.value, used.value

    def busy_percent(self, index: int) -> int:
        value = ctypes.c_uint32(0)
        self.call("rsmi_dev_busy_percent_get", index, ctypes.byref(value))
        return value.value

    def temperature_mc(self, index: int) -> int:
        """The first sensor that answers, m°C; unsupported when none does."""
        value = ctypes.c_int64(0)
        for sensor in TEMPERATURE_SENSORS:
            try:
                args = (index, sensor, TEMPERATURE_CURRENT, ctypes.byref(value))
                self.call("rsmi_dev_temp_metric_get", *args)
                return value.value
            except clib.LibUnsupported:
                continue
        raise self.codes.error("rsmi_dev_temp_metric_get", NOT_SUPPORTED, "no sensor answers")

    def power_uw(self, index: int) -> int:
        """Power drawn, µW: ``rsmi_dev_power_get`` (current or average, whichever the card has);
        the older ``rsmi_dev_power_ave_get`` when the library lacks or refuses the newer call."""
        value, kind = ctypes.c_uint64(0), ctypes.c_int(0)
        try:
            self.call("rsmi_dev_power_get", index, ctypes.byref(value), ctypes.byref(kind))
            return value.value
        except clib.LibUnsupported:
            pass
        self.call("rsmi_dev_power_ave_get", index, 0, ctypes.byref(value))
        return value.value

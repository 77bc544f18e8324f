"""The DMI MIG adapter: the one module that opens Hygon's ``libhydmi_mig.so`` (DCU partitions).

The library mirrors NVML's MIG calls under NVML's own symbol names (``nvmlDeviceGet…``), so it is
opened privately (``RTLD_LOCAL``) and never next to ``libnvidia-ml``. It has no init call:
loading it is the init. Traps: MIG mode is one switch for the whole node; the profile argument
is a slice-count *index* (0..3 for 1, 2, 3, 4 slices), not a profile id; ``memory_size_MB`` is
MiB. Optional: a host without the library simply offers no partitions.
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.devices.libs import clib

CANDIDATES = (
    "libhydmi_mig.so.1",
    "libhydmi_mig.so",
    "/opt/hyhal/lib/libhydmi_mig.so.1",
    "/opt/hyhal/lib/libhydmi_mig.so",
    "/opt/dtk/lib/libhydmi_mig.so.1",
    "/opt/dtk/lib/libhydmi_mig.so",
)
"""gpustack-runtime's order: the versioned soname first (a host may carry only it), on the
loader path, then in the hyhal and DTK trees, which are not on it."""
LIBRARY = "DMI MIG (libhydmi_mig.so)"
PROFILE_INDEXES = range(4)
"""1, 2, 3 and 4 slices."""

INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
GAPS = frozenset({INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND})
"""What a card answers for a slice-count index it has no profile at: a gap, not a fault."""
CODES = clib.Codes(
    names={
        1: "UNINITIALIZED",
        INVALID_ARGUMENT: "INVALID_ARGUMENT",
        NOT_SUPPORTED: "NOT_SUPPORTED",
        4: "NO_PERMISSION",
        NOT_FOUND: "NOT_FOUND",
        12: "LIBRARY_NOT_FOUND",
        13: "FUNCTION_NOT_FOUND",
        27: "NOT_READY",
        999: "UNKNOWN",
    },
    unsupported=frozenset({NOT_SUPPORTED, 4, 6, 13}),
    unavailable=frozenset({12}),
)


class ProfileInfo(ctypes.Structure):
    """``dmiGpuInstanceProfileInfo_t`` (``dmi_mig.h`` 1.3.1)."""

    _fields_ = [
        ("id", ctypes.c_uint),
        ("gi_count_max", ctypes.c_uint),
        ("cu_count", ctypes.c_uint),
        ("gpu_slice_count", ctypes.c_uint),
        ("memory_size_MB", ctypes.c_ulonglong),
        ("name", ctypes.c_char * 256),
    ]


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, CANDIDATES, CODES)


class DmiMig(clib.Binding):
    def __init__(self, library: Any) -> None:
        super().__init__(library, CODES)

    def mig_mode(self) -> bool:
        """The node's *current* MIG mode (one switch for every DCU)."""
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        self.call("nvmlGetSystemMigMode", ctypes.byref(current), ctypes.byref(pending))
        return current.value == 1

    def profiles(self, bus_id: str) -> list[tuple[str, int, int, int]]:
        """``(name, MiB, slices, instances)`` of each profile the DCU at ``bus_id`` offers."""
        handle = ctypes.c_void_p(None)
        self.call("nvmlDeviceGetHandleByPciBusId", bus_id.encode(), ctypes.byref(handle))
        found = []
        query = self.function("nvmlDeviceGetGpuInstanceProfileInfo")
        for index in PROFILE_INDEXES:
            info = ProfileInfo()
            status = int(query(handle, index, ctypes.byref(info)))
            if status in GAPS:
                continue  # no profile at this slice count; the others still count
            if status != 0:
                self.errors_by_call["nvmlDeviceGetGpuInstanceProfileInfo"] += 1
                raise self.codes.error("nvmlDeviceGetGpuInstanceProfileInfo", status)
            found.append(
                (
                    clib.text(info.name),
                    int(info.memory_size_MB),
                    int(info.gpu_slice_count),
                    int(info.gi_count_max),
                )
            )
        return found

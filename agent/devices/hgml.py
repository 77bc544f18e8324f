"""The HGML adapter: the one module that opens T-Head's ``libhgml.so`` (Alibaba PPUs).

HGML is NVML-shaped with an ``hgml`` prefix, "Hggc" where NVML says "Cuda" and NVML's status
codes. It is T-Head's library, not Hygon's (Hygon is read through ROCm SMI). The calls are bound
by :class:`agent.devices.nvmlabi.NvmlAbi`; the library is opened privately.
"""

from __future__ import annotations

from typing import Any

from agent.devices import clib, nvmlabi

CANDIDATES = (
    "libhgml.so",
    "/usr/local/PPU_SDK/lib64/libhgml.so",
    "/usr/local/PPU_SDK/lib/libhgml.so",
)
LIBRARY = "HGML (libhgml.so)"


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, CANDIDATES, nvmlabi.CODES)


def binding(library: Any) -> nvmlabi.NvmlAbi:
    return nvmlabi.NvmlAbi(library, prefix="hgml", cuda="Hggc")

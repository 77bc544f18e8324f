"""The HGML adapter: the one module that opens T-Head's ``libhgml.so`` (Alibaba PPUs).

HGML is NVML-shaped with an ``hgml`` prefix, "Hggc" where NVML says "Cuda" and NVML's status
codes. It is T-Head's library, not Hygon's (Hygon is read through ROCm SMI). The calls are bound
by :class:`agent.devices.libs.nvmlabi.NvmlAbi`; the library is opened privately.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from agent.devices.libs import clib, nvmlabi


def candidates(env: Mapping[str, str]) -> tuple[str, ...]:
    """The loader path, then ``$PPU_HOME`` (default ``/usr/local/PPU_SDK``) ``lib64``, ``lib``:
    the reference's order (gpustack-runtime instead falls back to a ``libhgml.so`` it bundles,
    which this agent does not ship)."""
    home = env.get("PPU_HOME") or "/usr/local/PPU_SDK"
    return ("libhgml.so", f"{home}/lib64/libhgml.so", f"{home}/lib/libhgml.so")


CANDIDATES = candidates({})
LIBRARY = "HGML (libhgml.so)"


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, candidates(os.environ), nvmlabi.CODES)


def binding(library: Any) -> nvmlabi.NvmlAbi:
    return nvmlabi.NvmlAbi(library, prefix="hgml", cuda="Hggc")

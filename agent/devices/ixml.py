"""The IXML adapter: the one module that opens Iluvatar CoreX's ``libixml.so``.

IXML is NVML re-implemented under NVML's own symbol names; the calls are bound by
:class:`agent.devices.nvmlabi.NvmlAbi`. The library is opened privately, never as ``pynvml``.
"""

from __future__ import annotations

from typing import Any

from agent.devices import clib, nvmlabi

CANDIDATES = (
    "libixml.so",
    "/usr/local/corex/lib64/libixml.so",
    "/usr/local/corex/lib/libixml.so",
)
LIBRARY = "IXML (libixml.so)"


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, CANDIDATES, nvmlabi.CODES)


def binding(library: Any) -> nvmlabi.NvmlAbi:
    return nvmlabi.NvmlAbi(library, prefix="nvml", cuda="Cuda")

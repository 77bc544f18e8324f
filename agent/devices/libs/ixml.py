"""The IXML adapter: the one module that opens Iluvatar CoreX's ``libixml.so``.

IXML is NVML re-implemented under NVML's own symbol names; the calls are bound by
:class:`agent.devices.libs.nvmlabi.NvmlAbi`. The library is opened privately, never as ``pynvml``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from agent.devices.libs import clib, nvmlabi


def candidates(env: Mapping[str, str]) -> tuple[str, ...]:
    """The loader path, then ``$COREX_HOME`` (default ``/usr/local/corex``) ``lib64``, ``lib``:
    gpustack-runtime's order."""
    home = env.get("COREX_HOME") or "/usr/local/corex"
    return ("libixml.so", f"{home}/lib64/libixml.so", f"{home}/lib/libixml.so")


CANDIDATES = candidates({})
LIBRARY = "IXML (libixml.so)"


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load(LIBRARY, candidates(os.environ), nvmlabi.CODES)


def binding(library: Any) -> nvmlabi.NvmlAbi:
    return nvmlabi.NvmlAbi(library, prefix="nvml", cuda="Cuda")

"""Iluvatar CoreX GPUs through IXML (an NVML clone, see :mod:`agent.devices.clones`).

``physicalIndexes`` is ``[minor]``: the GPU's node is ``/dev/iluvatar<minor>``, not the index;
when the minor number is unreadable it is the index, as gpustack-runtime's CDI generator does
(the node a container then gets is the one GPUStack's own deployer would give it).
The runtime version is IXML's CUDA-style driver version (the CoreX SDK level), omitted when the
library reports none (``CUDA Version: N/A`` in ``ixsmi``).
"""

from __future__ import annotations

from typing import Any

from agent.devices import clones
from agent.devices.hostfs import HostFS
from agent.devices.libs import ixml

MANUFACTURER = "iluvatar"


def _minor(index: int, minor: int | None) -> int | None:
    return minor if minor is not None else index


def reader(library: Any | None, host: HostFS) -> clones.CloneReader:
    """The reader over ``library`` (a simulator), else over the host's ``libixml.so``.

    :raises clib.LibUnavailable: the library cannot be loaded.
    """
    lib = library if library is not None else ixml.load()
    return clones.CloneReader(
        MANUFACTURER, ixml.LIBRARY, ixml.binding(lib), host, node_number=_minor
    )

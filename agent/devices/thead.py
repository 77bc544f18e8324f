"""T-Head (Alibaba) PPUs through HGML (an NVML clone, see :mod:`agent.devices.clones`).

``physicalIndexes`` is ``[ordinal]``: a PPU's node is ``/dev/alixpu_ppu<ordinal>``, named by the
card's enumeration ordinal; its minor number is one higher on real hosts (``/dev/alixpu`` holds
minor 0), so the minor is not the node number. A card in MIG mode reports its partition profiles
(copy-engine profiles excluded) instead of software slices.
"""

from __future__ import annotations

from typing import Any

from agent.devices import clones
from agent.devices.hostfs import HostFS
from agent.devices.libs import hgml

MANUFACTURER = "thead"


def _ordinal(index: int, minor: int | None) -> int | None:
    return index


def reader(library: Any | None, host: HostFS) -> clones.CloneReader:
    """The reader over ``library`` (a simulator), else over the host's ``libhgml.so``.

    :raises clib.LibUnavailable: the library cannot be loaded.
    """
    lib = library if library is not None else hgml.load()
    return clones.CloneReader(
        MANUFACTURER, hgml.LIBRARY, hgml.binding(lib), host, node_number=_ordinal, partitions=True
    )

"""Cambricon MLUs through CNDev: identity, versions and usage per card.

``physicalIndexes`` is ``[N]``, the card's slot: ``/dev/cambricon_dev<N>`` and
``CAMBRICON_VISIBLE_DEVICES`` use it, and it is CNDev's enumeration index. The driver version is
per card (``major.minor.build``); the runtime is the Neuware version from
``/usr/local/neuware/version.txt`` when the host has one. CNDev reports no core count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from agent.devices.hostfs import HostFS
from agent.devices.libs import clib, cndev
from agent.devices.vendor import Card, Get, Usage

MANUFACTURER = "cambricon"
NEUWARE_VERSION = "/usr/local/neuware/version.txt"
_VERSION = re.compile(r"(\d+\.\d+\.\d+)")


class CambriconReader:
    """:class:`agent.devices.vendor.Reader` over CNDev; a slot is an enumeration index."""

    manufacturer = MANUFACTURER
    library = cndev.LIBRARY

    def __init__(self, lib: cndev.Cndev, host: HostFS) -> None:
        self.cndev = lib
        self.host = host

    @contextmanager
    def session(self) -> Iterator[object]:
        """Init for the pass; ``cndevRelease`` frees what init allocated."""
        self.cndev.init()
        try:
            yield self
        finally:
            with suppress(clib.LibError):
                self.cndev.release()

    def versions(self) -> tuple[str | None, str | None]:
        m = _VERSION.search(self.host.read_text(NEUWARE_VERSION) or "")
        return None, clib.brief_version(m.group(1)) if m else None

    def slots(self) -> range:
        return range(self.cndev.device_count())

    def identify(self, slot: int) -> tuple[Any, str]:
        handle = self.cndev.handle(slot)
        uuid = self.cndev.uuid(handle)
        if not uuid:
            raise clib.LibFailed("cndevGetUUID", 7, "UNKNOWN", "empty UUID")
        return (slot, handle), uuid

    def describe(self, handle: tuple[int, int], card: Card, get: Get) -> None:
        slot, h = handle
        card.physical_indexes = (slot,)
        card.bus_id = get(self.cndev.pci_bus_id, h)
        card.name = get(self.cndev.name, h) or None
        card.driver_version = get(self.cndev.driver_version, h)
        memory = get(self.cndev.memory, h)
        card.memory_mib = memory[0] if memory else None

    def measure(self, handle: tuple[int, int], get: Get) -> Usage:
        _, h = handle
        memory = get(self.cndev.memory, h)
        return Usage(
            memory_mib=memory[0] if memory else None,
            memory_used_mib=memory[1] if memory else None,
            cores_utilization=get(self.cndev.utilization, h),
            temperature=get(self.cndev.temperature, h),
            power_w=get(self.cndev.power, h),
        )

    def release(self, handle: Any) -> None:
        pass


def reader(library: Any | None, host: HostFS) -> CambriconReader:
    """The reader over ``library`` (a simulator), else over the host's ``libcndev.so``.

    :raises clib.LibUnavailable: the library cannot be loaded.
    """
    return CambriconReader(cndev.Cndev(library if library is not None else cndev.load()), host)

"""Moore Threads GPUs through MTML: identity, versions and usage per device handle.

``physicalIndexes`` is ``[cardN, renderD minor]`` from sysfs (the ``/dev/dri`` nodes a container
needs). Power is converted from mW to W (one detector passes mW through as W, a 1000× error).
No runtime version or compute capability is reported: MTML has no call for either. The HDMI/DP
audio function each card also exposes shares the vendor id; the PCI check's class gate drops it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from agent.devices import vendor
from agent.devices.hostfs import HostFS
from agent.devices.libs import clib, mtml
from agent.devices.vendor import Card, Get, Usage

MANUFACTURER = "mthreads"


class MthreadsReader:
    """:class:`agent.devices.vendor.Reader` over MTML; a handle is an MTML device object."""

    manufacturer = MANUFACTURER
    library = mtml.LIBRARY

    def __init__(self, lib: mtml.Mtml, host: HostFS) -> None:
        self.mtml = lib
        self.host = host

    @contextmanager
    def session(self) -> Iterator[object]:
        """One library handle per pass, shut down after it."""
        self.mtml.init()
        try:
            yield self
        finally:
            with suppress(clib.LibError):
                self.mtml.shutdown()

    def versions(self) -> tuple[str | None, str | None]:
        driver = None
        with suppress(clib.LibUnsupported):
            driver = self.mtml.driver_version() or None
        return driver, None

    def slots(self) -> range:
        return range(self.mtml.device_count())

    def identify(self, slot: int) -> tuple[Any, str]:
        device = self.mtml.device(slot)
        try:
            return device, self.mtml.uuid(device)
        except clib.LibError:
            self.release(device)
            raise

    def describe(self, handle: Any, card: Card, get: Get) -> None:
        card.bus_id = get(self.mtml.pci_bus_id, handle)
        card.physical_indexes = vendor.drm_numbers(self.host, card.bus_id) if card.bus_id else None
        card.name = get(self.mtml.name, handle) or None
        memory = get(self.mtml.memory, handle)
        card.memory_mib = memory[0] >> 20 if memory else None
        card.cores = get(self.mtml.gpu_cores, handle) or None

    def measure(self, handle: Any, get: Get) -> Usage:
        memory = get(self.mtml.memory, handle)
        gpu = get(self.mtml.gpu, handle)
        power = get(self.mtml.power_mw, handle)
        return Usage(
            memory_mib=memory[0] >> 20 if memory else None,
            memory_used_mib=memory[1] >> 20 if memory else None,
            cores_utilization=gpu[0] if gpu else None,
            temperature=gpu[1] if gpu else None,
            power_w=power // 1000 if power is not None else None,
        )

    def release(self, handle: Any) -> None:
        with suppress(clib.LibError):
            self.mtml.free_device(handle)


def reader(library: Any | None, host: HostFS) -> MthreadsReader:
    """The reader over ``library`` (a simulator), else over the host's ``libmtml.so``.

    :raises clib.LibUnavailable: the library cannot be loaded.
    """
    return MthreadsReader(mtml.Mtml(library if library is not None else mtml.load()), host)

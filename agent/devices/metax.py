"""MetaX GPUs through MXSML: identity, versions and usage per device id.

``physicalIndexes`` is ``[cardN, renderD minor]`` from the function's ``drm`` entries in sysfs
(what ``/dev/dri`` nodes a container needs), not the device id. The driver version is per
device; the runtime is the MACA version, ``major.minor``. ``family`` is the product line the
library reports, named as GPUStack names it (``MXN``, ``MXC`` or ``MXG``). Every virtualization mode (bare metal, PF, VF)
is reported: skipping PFs loses whole cards on SR-IOV hosts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from agent.devices import vendor
from agent.devices.hostfs import HostFS
from agent.devices.libs import clib, mxsml
from agent.devices.vendor import Card, Get, Usage

MANUFACTURER = "metax"


class MetaxReader:
    """:class:`agent.devices.vendor.Reader` over MXSML; a slot is a device id."""

    manufacturer = MANUFACTURER
    library = mxsml.LIBRARY

    def __init__(self, lib: mxsml.Mxsml, host: HostFS) -> None:
        self.mxsml = lib
        self.host = host

    @contextmanager
    def session(self) -> Iterator[object]:
        """MXSML's shutdown only clears the binding's flags; init each pass is enough."""
        self.mxsml.init()
        yield self

    def versions(self) -> tuple[str | None, str | None]:
        maca = None
        with suppress(clib.LibUnsupported):
            maca = self.mxsml.maca_version()
        return None, clib.brief_version(maca)

    def slots(self) -> range:
        return range(self.mxsml.device_count())

    def identify(self, slot: int) -> tuple[Any, str]:
        info = self.mxsml.device_info(slot)
        if not info[0]:
            raise clib.LibFailed("mxSmlGetDeviceInfo", mxsml.FAILURE, "FAILURE", "empty UUID")
        return (slot, info), info[0]

    def describe(self, handle: tuple[int, tuple[str, str, str, int]], card: Card, get: Get) -> None:
        device, (_, name, bdf, brand) = handle
        card.bus_id = bdf or None
        card.name = name or None
        card.family = mxsml.BRANDS.get(brand)
        card.physical_indexes = vendor.drm_numbers(self.host, bdf) if bdf else None
        card.driver_version = get(self.mxsml.driver_version, device) or None
        memory = get(self.mxsml.memory, device)
        card.memory_mib = memory[0] if memory else None

    def measure(self, handle: tuple[int, tuple[str, str, str, int]], get: Get) -> Usage:
        device, (*_, brand) = handle
        memory = get(self.mxsml.memory, device)
        power = get(self.mxsml.power_mw, device)
        return Usage(
            memory_mib=memory[0] if memory else None,
            memory_used_mib=memory[1] if memory else None,
            cores_utilization=get(self.mxsml.utilization, device, brand),
            temperature=get(self.mxsml.temperature, device),
            power_w=power // 1000 if power is not None else None,
        )

    def release(self, handle: Any) -> None:
        pass


def reader(library: Any | None, host: HostFS) -> MetaxReader:
    """The reader over ``library`` (a simulator), else over the host's ``libmxsml.so``.

    :raises clib.LibUnavailable: the library cannot be loaded.
    """
    return MetaxReader(mxsml.Mxsml(library if library is not None else mxsml.load()), host)

"""Huawei Ascend NPUs through DCMI: what each chip is, and its usage now.

- identity: the chip's die id (the virtual die; on V2 drivers the A5's own die when the virtual
  one is refused), written ``NPU-`` + five zero-padded hex words joined by dashes. GPUStack's
  rendering (un-padded upper-case words joined by spaces) cannot be used: a device-plugin token
  id (``<group>:<id>:<index>``) may hold no whitespace. A PCI address is never an id (two chips
  of a duo card share one);
- ``physicalIndexes``: ``[physical id, card id, device id]``; ``/dev/davinci<N>`` and
  ``ASCEND_VISIBLE_DEVICES`` use the physical id, which need not equal the enumeration index;
- cores: AI cores; family: the SoC line (``910B``, ``310P``, ``910C`` for the A3 chips that
  name themselves ``910_93xx``, ``950``) from the chip name; the CANN version comes from
  the toolkit's ``version.info`` when the host has one;
- MCU and CPU units of a card are skipped; a unit whose type cannot be read is kept.

The reader also performs the one driver change the device plugin asks of DCMI:
:meth:`AscendReader.share_container` turns a chip's container-share flag on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agent.devices.hostfs import HostFS
from agent.devices.libs import clib, dcmi
from agent.devices.vendor import Card, Get, Usage

MANUFACTURER = "ascend"

CANN_VERSION_FILES = (
    "/usr/local/Ascend/cann/version.info",
    "/usr/local/Ascend/cann/share/info/runtime/version.info",
    "/usr/local/Ascend/ascend-toolkit/latest/runtime/version.info",
    "/usr/local/Ascend/ascend-toolkit/latest/version.info",
)
_VERSION_LINE = re.compile(r"^\s*version\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)
_SOC = re.compile(r"^(?:Ascend)?(\d{3}[A-Z]?)(?:\d+[A-Z]*)?$", re.IGNORECASE)


def family(chip_name: str) -> str | None:
    """The SoC line of a chip name: ``910B2`` → ``910B``, ``310P3`` → ``310P``."""
    name = chip_name.strip()
    if name.startswith("910_93"):
        return "910C"  # A3: what GPUStack's docs and images call it
    if "950" in name:
        return "950"
    m = _SOC.match(name)
    return m.group(1).upper() if m else None


def uuid(die: tuple[int, ...]) -> str:
    return "NPU-" + "-".join(f"{word:08x}" for word in die)


class AscendReader:
    """:class:`agent.devices.vendor.Reader` over DCMI; a slot is ``(card_id, device_id)``."""

    manufacturer = MANUFACTURER
    library = "DCMI (libdcmi.so)"

    def __init__(self, lib: dcmi.Dcmi, host: HostFS) -> None:
        self.dcmi = lib
        self.host = host

    @contextmanager
    def session(self) -> Iterator[object]:
        """DCMI has no shutdown call; init is repeated each pass (it is idempotent)."""
        self.dcmi.init()
        yield self

    def share_container(self, physical: int) -> bool:
        """Turn on the container-share flag of the chip with physical id ``physical``.

        Idempotent: a chip whose flag is already on is left alone. Returns whether it changed.
        The flag is never turned off here: other tenants of the chip may rely on it. A V2-only
        driver (Ascend 950) has no such flag at all (the reference's binding: no V2 entry point),
        so there is nothing to turn on and containers are not kept apart by it: False.

        :raises clib.LibError: DCMI refused a call (not root on the physical machine, no chip).
        """
        with self.session():
            if self.dcmi.v2:
                return False
            card, device = self.dcmi.card_device_of(physical)
            if self.dcmi.share_enabled(card, device):
                return False
            self.dcmi.set_share_enabled(card, device, True)
            return True

    def versions(self) -> tuple[str | None, str | None]:
        try:
            driver: str | None = self.dcmi.driver_version() or None
        except clib.LibUnsupported:
            driver = None
        return driver, clib.brief_version(self._cann_version())

    def _cann_version(self) -> str | None:
        for path in CANN_VERSION_FILES:
            m = _VERSION_LINE.search(self.host.read_text(path) or "")
            if m:
                return m.group(1)
        return None

    def slots(self) -> list[tuple[int, int]]:
        return [
            (card, device)
            for card in self.dcmi.card_list()
            for device in range(self.dcmi.device_count(card))
            if self._is_npu(card, device)
        ]

    def _is_npu(self, card: int, device: int) -> bool:
        try:
            return self.dcmi.unit_type(card, device) == dcmi.UNIT_NPU
        except clib.LibError:
            return True

    def identify(self, slot: tuple[int, int]) -> tuple[Any, str]:
        return slot, uuid(self.dcmi.die_id(*slot))

    def describe(self, handle: tuple[int, int], card: Card, get: Get) -> None:
        card_id, device_id = handle
        card.bus_id = get(self.dcmi.pci_bus_id, card_id, device_id)
        logic = get(self.dcmi.logic_id, card_id, device_id)
        physical = get(self.dcmi.physical_id, logic) if logic is not None else None
        if physical is not None:
            card.physical_indexes = (physical, card_id, device_id)
        chip = get(self.dcmi.chip_info, card_id, device_id)
        if chip:
            card.name, card.cores = chip[0] or None, chip[1] or None
            card.family = family(chip[0])
        memory = get(self.dcmi.memory, card_id, device_id)
        card.memory_mib = memory[0] if memory else None

    def measure(self, handle: tuple[int, int], get: Get) -> Usage:
        memory = get(self.dcmi.memory, *handle)
        power = get(self.dcmi.power_deciwatts, *handle)
        return Usage(
            memory_mib=memory[0] if memory else None,
            memory_used_mib=memory[1] if memory else None,
            cores_utilization=get(self.dcmi.aicore_utilization, *handle),
            temperature=get(self.dcmi.temperature, *handle),
            power_w=power // 10 if power is not None else None,
        )

    def release(self, handle: Any) -> None:
        pass


def reader(library: Any | None, host: HostFS) -> AscendReader:
    """The reader over ``library`` (a simulator), else over the host's ``libdcmi.so``.

    :raises clib.LibUnavailable: the library cannot be loaded.
    """
    return AscendReader(dcmi.Dcmi(library if library is not None else dcmi.load()), host)

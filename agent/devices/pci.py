"""The PCI check: which accelerators of a vendor the kernel sees, and where they sit.

Reads ``/sys/bus/pci/devices`` only; loads no vendor library. A manufacturer whose vendor id has
no accelerator-class function here is skipped before its library is touched, which is what makes
``dm detect`` fast and quiet on nodes without that vendor's cards.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.devices.hostfs import HostFS

PCI_DEVICES = "/sys/bus/pci/devices"

# Class codes are 24 bits: base class, subclass, programming interface.
_ACCELERATOR_BASE_CLASSES = frozenset({0x03, 0x12})  # display controller, processing accelerator
_COPROCESSOR_CLASS = 0x0B40  # processor / co-processor
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs describes it. Ids are integers; absent attributes are None."""

    bdf: str
    vendor: int
    device: int
    pci_class: int
    revision: int | None = None
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    numa_node: int | None = None
    cpu_list: str | None = None
    bridges: tuple[str, ...] = ()
    """Upstream PCI bridges, outermost first (the root complex itself is not included)."""


def is_accelerator_class(pci_class: int) -> bool:
    """True for display controllers, processing accelerators and co-processors.

    This excludes what shares a GPU vendor's id without being an accelerator: the NVSwitch bridge
    (``0x0680``), the HDMI audio function (``0x0403``), USB-C controllers (``0x0c03``).
    """
    return (pci_class >> 16) in _ACCELERATOR_BASE_CLASSES or (pci_class >> 8) == _COPROCESSOR_CLASS


def normalize_bdf(bus_id: str) -> str:
    """Normalize a PCI address to lowercase ``dddd:bb:dd.f``.

    NVML's ``busId`` has an 8-digit domain (``00000000:18:00.0``); sysfs has 4 digits.
    """
    text = bus_id.strip().lower()
    if text.count(":") == 1:
        return f"0000:{text}"
    domain, _, rest = text.partition(":")
    if len(domain) > 4 and set(domain[:-4]) <= {"0"}:
        domain = domain[-4:]
    return f"{domain.zfill(4)}:{rest}"


def scan(host: HostFS, vendor: int) -> list[PciFunction]:
    """Return the vendor's accelerator-class functions, ordered by PCI address."""
    return scan_vendors(host, {vendor}).get(vendor, [])


def scan_vendors(host: HostFS, vendors: set[int]) -> dict[int, list[PciFunction]]:
    """One pass over the PCI tree for several vendors: vendor id → its accelerator functions."""
    found: dict[int, list[PciFunction]] = {}
    for bdf in host.list_dir(PCI_DEVICES):
        vendor = host.read_int(f"{PCI_DEVICES}/{bdf}/vendor")
        if vendor not in vendors:
            continue
        pci_class = host.read_int(f"{PCI_DEVICES}/{bdf}/class")
        if pci_class is None or not is_accelerator_class(pci_class):
            continue
        found.setdefault(vendor, []).append(read_function(host, bdf))
    return found


def read_function(host: HostFS, bdf: str) -> PciFunction:
    """Read one function's identity and locality; missing attributes become None."""
    base = f"{PCI_DEVICES}/{bdf}"
    numa = host.read_int(f"{base}/numa_node")
    return PciFunction(
        bdf=bdf,
        vendor=host.read_int(f"{base}/vendor") or 0,
        device=host.read_int(f"{base}/device") or 0,
        pci_class=host.read_int(f"{base}/class") or 0,
        revision=host.read_int(f"{base}/revision"),
        subsystem_vendor=host.read_int(f"{base}/subsystem_vendor"),
        subsystem_device=host.read_int(f"{base}/subsystem_device"),
        numa_node=numa if numa is not None and numa >= 0 else None,
        cpu_list=host.read_text(f"{base}/local_cpulist") or None,
        bridges=bridges_of(host, bdf),
    )


def bridges_of(host: HostFS, bdf: str) -> tuple[str, ...]:
    """Return the bridges between the root complex and ``bdf``, outermost first.

    ``/sys/bus/pci/devices/<bdf>`` links to ``/sys/devices/pci0000:00/<bridge>/.../<bdf>``; every
    path component shaped like a PCI address before the device itself is a bridge.
    """
    target = host.resolve_link(f"{PCI_DEVICES}/{bdf}")
    if target is None:
        return ()
    chain = [part for part in target.split("/") if _BDF.match(part)]
    return tuple(chain[:-1]) if chain and chain[-1] == bdf else ()


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Format CPU (or NUMA node) numbers as a kernel list string: ``0-3,8,10-11``."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = prev = None
    for cpu in ordered:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    if start is not None:
        runs.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(runs)


def bits_to_numbers(words: Iterable[int], word_bits: int = 64) -> list[int]:
    """Expand a bitmask given as words (least significant first) into the set bit positions.

    NVML reports CPU and memory affinity this way (``c_ulong`` arrays).
    """
    return [
        position * word_bits + bit
        for position, word in enumerate(words)
        for bit in range(word_bits)
        if word >> bit & 1
    ]

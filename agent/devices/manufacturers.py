"""The manufacturers the operator knows, with the facts detection and allocation key on.

The nine keys follow the reference system. NVIDIA is read through NVML, AMD from sysfs, and the
other seven through their vendor's management library (:mod:`agent.devices.vendor`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Manufacturer:
    key: str
    pci_vendor: int
    resource: str
    """The kubelet extended-resource base name (``nvidia.com/gpu``)."""
    logical_slices: int
    """How many tenants software slicing allows per card (``logicalSliced.count``)."""
    cores_overcommit: bool
    """Whether sliced tenants may together ask for more than 100 % of the cores."""


MANUFACTURERS: dict[str, Manufacturer] = {
    m.key: m
    for m in (
        Manufacturer("amd", 0x1002, "amd.com/gpu", 128, True),
        Manufacturer("ascend", 0x19E5, "huawei.com/npu", 63, True),
        Manufacturer("cambricon", 0xCABC, "cambricon.com/mlu", 16, False),
        Manufacturer("hygon", 0x1D94, "hygon.com/dcu", 4, False),
        Manufacturer("iluvatar", 0x1E3E, "iluvatar.com/gpu", 16, False),
        Manufacturer("metax", 0x9999, "metax-tech.com/gpu", 16, False),
        Manufacturer("mthreads", 0x1ED5, "mthreads.com/gpu", 16, False),
        Manufacturer("nvidia", 0x10DE, "nvidia.com/gpu", 128, True),
        Manufacturer("thead", 0x1DED, "alibabacloud.com/ppu", 16, False),
    )
}

WITH_BACKEND = tuple(sorted(MANUFACTURERS))
"""Manufacturers this build can detect, in output order: all nine."""


class UnknownManufacturer(ValueError):
    """A ``--manufacturer`` value names no manufacturer we know."""


def parse_manufacturers(value: str | None) -> tuple[str, ...]:
    """Parse a comma-separated ``--manufacturer`` value; empty or ``all`` means every one.

    :raises UnknownManufacturer: naming the bad key and the valid ones.
    """
    if value is None or value.strip() in ("", "all", "*"):
        return tuple(sorted(MANUFACTURERS))
    keys = []
    for raw in value.split(","):
        key = raw.strip().lower()
        if not key:
            continue
        if key not in MANUFACTURERS:
            valid = ", ".join(sorted(MANUFACTURERS))
            raise UnknownManufacturer(f"unknown manufacturer {raw.strip()!r} (one of: {valid})")
        if key not in keys:
            keys.append(key)
    return tuple(sorted(keys))

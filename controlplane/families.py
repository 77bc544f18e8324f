"""The accelerator resource vocabulary admission and reconciling share: bases, families, units.

Admission reads a Pod's keys to judge its claims; reconciling writes the same keys as node
capacity and reads them back from Pods to tell the device agent what waits. Both need the same
answer to "which manufacturer's base is this key, and which of the four families", so it lives
here, below both: this module imports neither ``controlplane.admission`` nor
``controlplane.reconciling`` (the package's layer contract keeps it so).

Per manufacturer base ``<base>`` (``nvidia.com/gpu``) a key belongs to one family: exclusive
``<base>``, shared ``<base>.shared``, sliced ``<base>.sliced[.…]`` or partitioned
``<base>.partitioned[.…]``. A card is :data:`UNITS` units, so a slice and a partition of the same
memory cost the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

__all__ = [
    "BASES",
    "MANUFACTURER_OF",
    "PREFIX",
    "SLICING",
    "UNITS",
    "Family",
    "family_of",
]

UNITS: Final = 1_600_000
"""One whole accelerator."""
PREFIX: Final = "acceleratable.feature.gpustack.ai/"
"""The prefix of the accelerator-group labels (``…/<group>: "true"``)."""
BASES: Final[Mapping[str, str]] = {
    "nvidia": "nvidia.com/gpu",
    "amd": "amd.com/gpu",
    "ascend": "huawei.com/npu",
    "hygon": "hygon.com/dcu",
    "iluvatar": "iluvatar.com/gpu",
    "cambricon": "cambricon.com/mlu",
    "metax": "metax-tech.com/gpu",
    "mthreads": "mthreads.com/gpu",
    "thead": "alibabacloud.com/ppu",
}
"""Manufacturer to its extended-resource base."""
MANUFACTURER_OF: Final[Mapping[str, str]] = {base: mfr for mfr, base in BASES.items()}


class Family(StrEnum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    SLICED = "sliced"
    PARTITIONED = "partitioned"


SLICING: Final = frozenset({Family.SLICED, Family.PARTITIONED})
"""The families the device agent must be told about before kubelet's Allocate."""


def family_of(key: str) -> tuple[str, Family] | None:
    """``(base, family)`` of an accelerator key; None for anything else (visibility included)."""
    base = next((b for b in MANUFACTURER_OF if key == b or key.startswith(f"{b}.")), None)
    if base is None:
        return None
    rest = key[len(base) + 1 :]
    if key == base:
        return base, Family.EXCLUSIVE
    if rest == "shared":
        return base, Family.SHARED
    for family in (Family.SLICED, Family.PARTITIONED):
        if rest == family.value or rest.startswith(f"{family.value}."):
            return base, family
    return None

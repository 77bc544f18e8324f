"""What schedulers key on: node labels and ``Node.status.capacity`` keys, from a node's groups.

Pure functions. Labels (reference §7.1), with ``aKey`` = ``<manufacturer>-<product>``:

- ``feature.gpustack.ai/acceleratable=true`` and ``acceleratable.feature.gpustack.ai/<mfr>=true``;
- ``…/<mfr>.driver-version``, ``…/<mfr>.runtime-version`` when reported;
- ``…/<aKey>=true``, ``.product``, ``.count``, ``.memory`` (``80Gi`` or ``81559Mi``), ``.cores``,
  ``.family``, ``.comcap`` when reported.

Capacity (reference §7.2), per manufacturer base (``nvidia.com/gpu``): ``.sliced.units`` (sliceable
cards x 1,600,000), ``.sliced.memory-mib``, ``.sliced.cores-percentage``,
``.sliced.memory-percentage``, ``.partitioned.units`` and ``.partitioned.<kind>-<profile>``.

The control plane owns every label under the two prefixes and every capacity key of that shape;
keys it owns but no longer computes are removed (merge-patch ``null``), others are never touched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

from bus.devices import DeviceGroup
from controlplane.families import BASES, PREFIX, UNITS
from kit import k8snames

__all__ = ["capacity", "is_owned_capacity", "is_owned_label", "labels", "product_key"]

FEATURE: Final = "feature.gpustack.ai/acceleratable"
PARTITION_KIND: Final[Mapping[str, str]] = {"nvidia": "mig"}
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")
_OWNED_CAPACITY = re.compile(r"\.(sliced|partitioned)\.")


def label_value(text: str) -> str:
    """A valid label value: allowed characters only, alphanumeric ends, at most 63 characters
    (a longer one cut with a stable digest, so two long names stay apart)."""
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", _NOT_LABEL.sub("-", text))
    return k8snames.bounded(value, k8snames.LABEL_VALUE_MAX)


AKEY_MAX: Final = k8snames.LABEL_NAME_MAX - len(".product")
"""The longest ``aKey``: every label name part made of it (``<aKey>.product`` the longest, the
chain's fit labels ``<aKey>`` alone) stays within Kubernetes' 63."""


def product_key(group: DeviceGroup) -> str:
    """``aKey``: ``nvidia-h200`` (the group id already names NVIDIA), ``amd-radeon-rx-7800-xt``;
    one longer than :data:`AKEY_MAX` is cut with a stable digest (:func:`kit.k8snames.bounded`)."""
    key = (
        group.id
        if group.id.startswith(f"{group.manufacturer}-")
        else (f"{group.manufacturer}-{group.id}")
    )
    return k8snames.bounded(key, AKEY_MAX)


def _memory(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def labels(groups: Iterable[DeviceGroup]) -> dict[str, str]:
    """Every label the control plane owns, for a node with these groups (empty: no accelerator)."""
    out: dict[str, str] = {}
    for g in groups:
        if not g.accelerators:
            continue
        out[FEATURE] = "true"
        m = f"{PREFIX}{g.manufacturer}"
        out[m] = "true"
        if g.driver_version:
            out[f"{m}.driver-version"] = label_value(g.driver_version)
        if g.runtime_version:
            out[f"{m}.runtime-version"] = label_value(g.runtime_version)
        k = f"{PREFIX}{product_key(g)}"
        out[k] = "true"
        out[f"{k}.product"] = label_value(g.name)
        out[f"{k}.count"] = str(len(g.accelerators))
        optional = {
            "memory": _memory(g.memory) if g.memory else None,
            "cores": str(g.cores) if g.cores else None,
            "family": label_value(g.family) if g.family else None,
            "comcap": label_value(g.compute_capability) if g.compute_capability else None,
        }
        out.update({f"{k}.{name}": v for name, v in optional.items() if v})
    return out


def is_owned_label(key: str) -> bool:
    return key == FEATURE or key.startswith(PREFIX)


def is_owned_capacity(key: str) -> bool:
    base = key.split(".", 1)[0] if "/" in key else ""
    return any(key.startswith(b + ".") for b in BASES.values()) and bool(
        base and _OWNED_CAPACITY.search(key)
    )


def capacity(groups: Iterable[DeviceGroup]) -> dict[str, str]:
    """Every capacity key the control plane owns, as Quantity strings (pure)."""
    totals: dict[str, int] = {}

    def add(key: str, value: int) -> None:
        totals[key] = totals.get(key, 0) + value

    for g in groups:
        base = BASES.get(g.manufacturer, f"{g.manufacturer}.com/gpu")
        for a in g.accelerators:
            logical, physical = a.status.logical_sliced, a.status.physical_sliced
            if physical is not None:
                add(f"{base}.partitioned.units", UNITS)
                kind = PARTITION_KIND.get(g.manufacturer, "partition")
                for p in physical.profiles:
                    add(f"{base}.partitioned.{kind}-{p.name}", p.count)
            elif logical is not None and logical.count > 0:
                add(f"{base}.sliced.units", UNITS)
                add(f"{base}.sliced.memory-mib", g.memory or 0)
                add(f"{base}.sliced.memory-percentage", 100)
                cores = logical.count * 100 if logical.cores_percentage_overcommit else 100
                add(f"{base}.sliced.cores-percentage", cores)
    return {k: str(v) for k, v in sorted(totals.items())}

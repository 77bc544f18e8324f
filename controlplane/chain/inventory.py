"""What the chain knows of one node: its Node object's facts beside its ledger state (pure).

A node takes part in the chain when it is *managed*: the Node carries ``gpustack.ai/managed=true``
(set by the worker unless node management is manual). Its accelerators and their charges come
from the ledger (:mod:`controlplane.reconciling.allocating`), never from the Node: the ledger is
what the device agents reported, the Node only says where the node sits (os, arch, topology
profile) and its CPU.

The general key ``gKey`` is ``<cpu vendor>-<cpu name>`` from the CPU facts NFD leaves on the
Node (the ``feature.gpustack.ai/cpu-name`` annotation, the ``cpu-model.vendor_id`` label), or
``generic`` when they are missing or unreported (values starting ``@``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from bus.devices import DeviceGroup
from controlplane.admission.pods import parse_quantity
from controlplane.chain import naming
from controlplane.reconciling import allocating
from controlplane.reconciling.labeling import product_key
from controlplane.reconciling.nodestates import NodeState
from kit import k8snames

__all__ = ["Card", "NodeFacts", "facts_of", "general_key"]

CPU_NAME: Final = "feature.gpustack.ai/cpu-name"
CPU_VENDOR: Final = "feature.node.kubernetes.io/cpu-model.vendor_id"
_VENDORS: Final = {"authenticamd": "amd", "genuineintel": "intel", "hygongenuine": "hygon"}


class Card(msgspec.Struct, frozen=True, kw_only=True):
    """One accelerator as the chain weighs it: its charge and what it can still be split into."""

    id: str
    group: str
    """The group key (``aKey``)."""
    mode: str
    allocated: int
    slices: int
    """Logical slices hosted (sliced mode)."""
    slice_count: int
    """``logicalSliced.count``; 0: cannot be sliced."""
    partition_count: int
    """``physicalSliced.count``; 0: not in partition mode."""
    unhealthy: bool

    @property
    def remaining(self) -> int:
        return allocating.UNITS - self.allocated


class NodeFacts(msgspec.Struct, frozen=True, kw_only=True):
    """One managed node: where it sits, its CPU and its accelerators."""

    name: str
    os: str
    arch: str
    profile: str
    general: str
    cpu: int
    """Whole CPU cores of ``status.allocatable`` (else ``capacity``)."""
    groups: tuple[DeviceGroup, ...] = ()
    cards: tuple[Card, ...] = ()

    def group_cards(self, a_key: str) -> list[Card]:
        return [c for c in self.cards if c.group == a_key]


def general_key(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """``amd-epyc-7763`` from the CPU facts, ``generic`` without them."""
    name = annotations.get(CPU_NAME, "")
    if not name or name.startswith("@"):
        return "generic"
    vendor = _VENDORS.get(labels.get(CPU_VENDOR, "").lower(), "")
    key = naming.slug(name)
    for noise in ("amd-", "intel-r-", "intel-", "r-"):
        key = key.removeprefix(noise)
    key = f"{vendor}-{key}" if vendor else key
    return k8snames.bounded(key, k8snames.LABEL_NAME_MAX)  # the name part of its node label


def _cores(status: Mapping[str, Any]) -> int:
    for part in ("allocatable", "capacity"):
        raw = (status.get(part) or {}).get("cpu")
        if raw is not None:
            try:
                return int(parse_quantity(raw))
            except ValueError:
                return 0
    return 0


def facts_of(node: Mapping[str, Any], state: NodeState | None) -> NodeFacts:
    """The facts of a Node object and its ledger state (no state: a CPU-only node)."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    groups = tuple(g for g in (state.groups or ()) if g.accelerators) if state else ()
    cards: list[Card] = []
    if groups:
        status = allocating.devices_status(groups, state.allocations if state else {})
        keys = {a.id: product_key(g) for g in groups for a in g.accelerators}
        for card in status.cards.values():
            acc = card.accelerator
            logical, physical = acc.status.logical_sliced, acc.status.physical_sliced
            cards.append(
                Card(
                    id=acc.id, group=keys[acc.id], mode=card.mode, allocated=card.allocated,
                    slices=card.slices, slice_count=logical.count if logical else 0,
                    partition_count=physical.count if physical else 0,
                    unhealthy=acc.status.unhealthy,
                )
            )  # fmt: skip
    return NodeFacts(
        name=str(meta.get("name", "")),
        os=labels.get(naming.OS, "linux"),
        arch=labels.get(naming.ARCH, "amd64"),
        profile=labels.get(naming.PROFILE, naming.DEFAULT_PROFILE),
        general=general_key(labels, annotations),
        cpu=_cores(node.get("status") or {}),
        groups=groups,
        cards=tuple(cards),
    )

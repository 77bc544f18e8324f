"""The mutating decision: the JSON Patch that completes a Pod's accelerator requests. Pure.

It writes what the request model derives and nothing a user decides:

- ``<base>.sliced.units`` from the memory budget, and ``<base>.partitioned.units`` from the
  profile, in limits and requests, overwriting any value the client set (the units feed quota,
  so they are never taken on trust);
- ``<base>.sliced.cores-percentage: 100`` when the slice names no compute budget;
- for ``<base>.shared: N`` with N >= 2, the pin ``acceleratable.feature.gpustack.ai/<group>.count
  Gt N-1`` in every required node-affinity term, because ten tokens per card hide a node's card
  count from the scheduler and the label does not.

What it cannot derive it leaves alone: the validating webhook runs on the patched Pod and refuses
it with the reason (:mod:`controlplane.admission.validating`). The patch is idempotent: applied
twice, it changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from controlplane.admission.folds import partition_units, pinned_terms, sliced_units
from controlplane.admission.pods import PatchOp, Pod, Slot, pointer
from controlplane.admission.requests import (
    Catalog,
    Claim,
    Family,
    named_groups,
    read_int,
    requests_of,
)

__all__ = ["mutate"]


def mutate(pod: Pod, catalog: Catalog) -> list[PatchOp]:
    """The operations that complete ``pod``'s requests; empty when there is nothing to do."""
    groups = named_groups(pod)
    ops: list[PatchOp] = []
    for slot, claims in requests_of(pod):
        values: dict[str, str] = {}
        for claim in claims:
            values.update(_derived(slot, claim, groups, catalog))
        ops += _set_resources(slot, values)
    return ops + _shared_pin(pod, catalog)


def _derived(slot: Slot, claim: Claim, groups: Sequence[str], catalog: Catalog) -> dict[str, str]:
    out: dict[str, str] = {}
    if claim.family is Family.SLICED:
        fold = sliced_units(slot, claim, groups, catalog)
        if fold.units is not None:
            out[claim.key(".sliced.units")] = str(fold.units)
        cores = claim.key(".sliced.cores-percentage")
        if cores not in claim.values:
            out[cores] = "100"
    elif claim.family is Family.PARTITIONED:
        fold = partition_units(slot, claim, groups, catalog)
        if fold.units is not None:
            out[claim.key(".partitioned.units")] = str(fold.units)
    return out


def _set_resources(slot: Slot, values: Mapping[str, str]) -> list[PatchOp]:
    """Set ``values`` in the container's limits and requests, adding the maps that are absent."""
    if not values:
        return []
    resources = slot.container.resources
    if resources is None:
        whole = {"limits": dict(values), "requests": dict(values)}
        return [PatchOp(op="add", path=f"{slot.pointer}/resources", value=whole)]
    ops: list[PatchOp] = []
    for name, current in (("limits", resources.limits), ("requests", resources.requests)):
        where = f"{slot.pointer}/resources/{name}"
        if current is None:
            ops.append(PatchOp(op="add", path=where, value=dict(values)))
            continue
        ops += [
            PatchOp(op="add", path=where + pointer(key), value=value)
            for key, value in values.items()
            if current.get(key) != value
        ]
    return ops


def _shared_pin(pod: Pod, catalog: Catalog) -> list[PatchOp]:
    """The pin for the largest shared request (a Pod has one family; rule 1 refuses more)."""
    wanted: list[tuple[int, str]] = []
    for slot, claims in requests_of(pod):
        for claim in claims:
            if claim.family is Family.SHARED:
                count, _ = read_int(slot, claim, claim.key(".shared"))
                wanted.append((count or 0, claim.manufacturer))
    if not wanted or max(wanted)[0] < 2:
        return []
    cards, manufacturer = max(wanted)
    terms = pinned_terms(pod, manufacturer, catalog, cards)
    return [] if terms is None else [_set_terms(pod, msgspec.to_builtins(terms))]


def _set_terms(pod: Pod, terms: list[Any]) -> PatchOp:
    """Replace the required terms, adding whichever of their parents is absent (an ``add`` on a
    missing parent would fail the whole patch)."""
    path = ["spec", "affinity", "nodeAffinity", _REQUIRED, "nodeSelectorTerms"]
    affinity = pod.spec.affinity
    node = affinity.node_affinity if affinity else None
    required = node.required_during_scheduling_ignored_during_execution if node else None
    depth = (
        5 if required is not None else 4 if node is not None else 3 if affinity is not None else 2
    )
    value: Any = terms
    while len(path) > depth:
        value, path = {path[-1]: value}, path[:-1]
    return PatchOp(op="add", path=pointer(*path), value=value)


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"

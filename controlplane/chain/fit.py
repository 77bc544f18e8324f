"""Whether work fits a node's cards: the fit labels and the ``gpustack-node-devices`` check (pure).

**Fit labels** (per accelerator group ``aKey`` on the node):

- ``sliced-max-free-units.fit.gpustack.ai/<aKey>``: the most free units on one card that can
  still take a slice (sliceable, mode None or Sliced, a free slot), ``0`` when none;
- ``shared-free-cards.fit.gpustack.ai/<aKey>``: the cards that can still grant a share.

A Workload pinned ``Gt U-1`` / ``Gt N-1`` on them (the Workload webhook) only reaches nodes that
can fit it now, so Kueue's placement and the device plugin's agree far more often.

**The check** (:func:`decide`): after Kueue reserved quota and placed a Workload, every pod of
every PodSet must find room on the node(s) it was given: exclusive ``N`` free whole cards;
shared one share on each of ``N`` distinct cards; sliced its units on one card with a free slot;
partitioned its units on one partitioned card. Pods are placed one after the other on a copy of
the cards, already charged with the in-flight Workloads (admitted, not yet in the ledger), so
two Workloads admitted together cannot both count the same free card. The answer is ``Ready`` or
``Retry`` (never ``Rejected``: capacity comes back when other work ends).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from controlplane.admission.pods import Pod, parse_quantity
from controlplane.admission.requests import PERCENT_UNITS, Family, claims_of
from controlplane.chain import naming
from controlplane.chain.inventory import Card, NodeFacts
from controlplane.chain.views import SHARE_UNITS, can_share, can_slice, is_free
from controlplane.reconciling.allocating import UNITS

__all__ = ["Demand", "Verdict", "decide", "demands_of", "fit_labels", "is_fit_label"]


def fit_labels(node: NodeFacts) -> dict[str, str]:
    """The fit labels of every accelerator group on ``node``."""
    out: dict[str, str] = {}
    for a_key in dict.fromkeys(c.group for c in node.cards):
        cards = node.group_cards(a_key)
        sliced = max((c.remaining for c in cards if can_slice(c)), default=0)
        out[f"{naming.SLICED_FIT}{a_key}"] = str(sliced)
        out[f"{naming.SHARED_FIT}{a_key}"] = str(sum(1 for c in cards if can_share(c)))
    return out


def is_fit_label(key: str) -> bool:
    return key.startswith((naming.SLICED_FIT, naming.SHARED_FIT))


@dataclass(frozen=True)
class Demand:
    """What one pod of a PodSet asks of one node's cards."""

    family: Family
    amount: int
    """Cards (exclusive, shared) or units (sliced, partitioned)."""


@dataclass(frozen=True)
class Verdict:
    state: str
    """``Ready`` or ``Retry``."""
    message: str


def _units(values: Mapping[str, str | int], key: str) -> int:
    raw = values.get(key)
    try:
        return int(parse_quantity(raw)) if raw is not None else 0
    except ValueError:
        return 0


def demands_of(template_spec: Mapping[str, Any]) -> list[Demand]:
    """The per-pod demands of a PodSet's pod template (``spec`` of its ``template``)."""
    try:
        pod = msgspec.convert({"spec": template_spec}, Pod)
    except msgspec.ValidationError:
        return []
    out: list[Demand] = []
    for container in [*(pod.spec.init_containers or ()), *pod.spec.containers]:
        for claim in claims_of(container):
            v = claim.values
            if claim.family in (Family.EXCLUSIVE, Family.SHARED):
                out.append(Demand(claim.family, _units(v, next(iter(v)))))
            elif claim.family is Family.SLICED:
                units = _units(v, claim.key(".sliced.units")) or (
                    _units(v, claim.key(".sliced.memory-percentage")) * PERCENT_UNITS
                )
                out.append(Demand(claim.family, units or UNITS))
            else:
                units = _units(v, claim.key(".partitioned.units"))
                out.append(Demand(claim.family, units or UNITS))
    return [d for d in out if d.amount > 0]


def _charge(cards: list[Card], index: int, units: int, mode: str, slot: bool = False) -> None:
    c = cards[index]
    cards[index] = msgspec.structs.replace(c, allocated=min(UNITS, c.allocated + units), mode=mode,
                           slices=c.slices + (1 if slot else 0))  # fmt: skip


def place(cards: list[Card], demand: Demand) -> bool:
    """Charge ``demand`` on ``cards`` (changed in place) when it fits; False when it does not."""
    if demand.family is Family.EXCLUSIVE:
        free = [i for i, c in enumerate(cards) if is_free(c)][: demand.amount]
        if len(free) < demand.amount:
            return False
        for i in free:
            _charge(cards, i, UNITS, "Exclusive")
        return True
    if demand.family is Family.SHARED:
        free = [i for i, c in enumerate(cards) if can_share(c)][: demand.amount]
        if len(free) < demand.amount:
            return False
        for i in free:
            _charge(cards, i, SHARE_UNITS, "Shared")
        return True
    if demand.family is Family.SLICED:
        fits = [i for i, c in enumerate(cards) if can_slice(c) and c.remaining >= demand.amount]
        mode, slot = "Sliced", True
    else:
        fits = [
            i for i, c in enumerate(cards)
            if c.partition_count > 0 and not c.unhealthy
            and c.mode in ("None", "Partitioned") and c.remaining >= demand.amount
        ]  # fmt: skip
        mode, slot = "Partitioned", False
    if not fits:
        return False
    best = min(fits, key=lambda i: cards[i].remaining)  # pack the fullest card first
    _charge(cards, best, demand.amount, mode, slot)
    return True


def place_pod(
    cards: dict[str, list[Card]], nodes: Sequence[str], demands: Sequence[Demand]
) -> str | None:
    """Place one pod's demands on the first of ``nodes`` that takes them all; the node or None."""
    for node in nodes:
        trial = list(cards.get(node, ()))
        if all(place(trial, d) for d in demands):
            cards[node] = trial
            return node
    return None


Where = Sequence[tuple[str | tuple[str, ...], int]]
"""``[(node, pods)]``; a tuple of nodes: each pod may go to any of them (no TAS assignment)."""


def decide(
    cards: Mapping[str, Sequence[Card]],
    pod_sets: Iterable[tuple[str, Sequence[Demand], Where]],
    in_flight: Iterable[tuple[Sequence[Demand], Where]] = (),
) -> Verdict:
    """Whether every pod fits its assigned nodes.

    ``pod_sets``: ``(name, per-pod demands, where)``; ``in_flight``: the same for the
    Workloads admitted but not yet allocated, charged first (best effort: one that no longer
    fits is skipped).
    """
    state = {n: list(cs) for n, cs in cards.items()}
    for demands, assignment in in_flight:
        for nodes, count in assignment:
            for _ in range(count):
                place_pod(state, [nodes] if isinstance(nodes, str) else nodes, demands)
    for name, demands, assignment in pod_sets:
        if not demands:
            continue
        for nodes, count in assignment:
            candidates = [nodes] if isinstance(nodes, str) else list(nodes)
            node = ", ".join(candidates) or "(none)"
            for i in range(count):
                if not any(n in state for n in candidates):
                    return Verdict(
                        "Retry", f"podset {name}: node {node} has no devices in the ledger"
                    )
                if place_pod(state, candidates, demands) is None:
                    return Verdict(
                        "Retry",
                        f"podset {name}: pod {i + 1} of {count} does not fit node {node} now "
                        f"({', '.join(f'{d.family.value} {d.amount}' for d in demands)})",
                    )
    return Verdict("Ready", "the assigned nodes' devices fit every pod")

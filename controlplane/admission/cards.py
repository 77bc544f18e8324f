"""The accelerator groups the worker's ledger knows: the :class:`Catalog` admission folds against.

Every replica folds the same bus events into its ledger (Kubernetes or ``standalone`` alike), so
any replica can answer a webhook. A group seen on several nodes gets the VRAM its nodes agree
on (:func:`agreed`): each node's report counts once, the reports within 1/32 of their median
agree (drivers report a few MiB apart), and the smallest agreeing report is the group's, so a
MiB request that fits it fits every agreeing card. A node alone in its claim cannot cap the
group (``-143771`` or ``1`` would refuse every request) nor inflate it: it is outvoted, and
without a strict majority the VRAM is unknown (``None``: a MiB request is refused with the
reason, a percentage still folds). Profiles are the union of what the group's nodes offer, each
at the size its offering nodes agree on (a disputed profile is left out).

The index is rebuilt from the ledger at most every ``max_age_s`` seconds, when a request asks:
a webhook call never walks the ledger twice in a burst, and a new group is known within that age.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from bus.devices import DeviceGroup
from controlplane.admission.requests import Card
from controlplane.reconciling.labeling import product_key
from controlplane.reconciling.nodestates import Ledger

__all__ = ["AGREEMENT", "LedgerCatalog", "agreed", "cards_of"]

AGREEMENT: Final = 32
"""Reports within ``median / AGREEMENT`` of the median agree (3 %: 2.5 GiB of an 80 GiB card)."""


def agreed(reports: Iterable[int]) -> int | None:
    """The smallest report of the strict majority that agrees with the median, or None (pure).

    ``reports`` holds one figure per node. Invariant: the answer is a figure a strict majority
    of the nodes reported within 1/:data:`AGREEMENT` of, so no single node among two or more
    honest ones moves it.
    """
    values = sorted(reports)
    if not values:
        return None
    median = values[(len(values) - 1) // 2]
    agreeing = [v for v in values if v > 0 and abs(v - median) * AGREEMENT <= median]
    return agreeing[0] if 2 * len(agreeing) > len(values) else None


class _Reports:
    """What each node says of one group: its card memory and its profiles' sizes (smallest)."""

    def __init__(self, manufacturer: str) -> None:
        self.manufacturer = manufacturer
        self.memory: dict[str, int] = {}
        self.profiles: dict[str, dict[str, int]] = {}

    def add(self, node: str, memory: int, group: DeviceGroup) -> None:
        self.memory[node] = min(self.memory.get(node, memory), memory)
        for a in group.accelerators:
            physical = a.status.physical_sliced
            for p in physical.profiles if physical else ():
                sizes = self.profiles.setdefault(p.name, {})
                sizes[node] = min(sizes.get(node, p.memory_mib), p.memory_mib)

    def card(self, key: str) -> Card:
        profiles = {n: mib for n, s in self.profiles.items() if (mib := agreed(s.values()))}
        memory = agreed(self.memory.values())
        return Card(group=key, manufacturer=self.manufacturer, memory_mib=memory, profiles=profiles)


def cards_of(nodes: Mapping[str, Iterable[DeviceGroup]]) -> dict[str, Card]:
    """One :class:`Card` per group key, agreed over the nodes' groups (``node -> groups``; pure)."""
    reports: dict[str, _Reports] = {}
    for node, groups in nodes.items():
        for g in groups:
            if not g.memory or not g.accelerators:
                continue
            key = product_key(g)
            reports.setdefault(key, _Reports(g.manufacturer)).add(node, g.memory, g)
    return {key: r.card(key) for key, r in reports.items()}


class LedgerCatalog:
    """A :class:`Catalog` over the ledger, re-indexed at most every ``max_age_s``."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._max_age_s = max_age_s
        self._clock = clock
        self._cards: dict[str, Card] = {}
        self._built: float | None = None

    def _index(self) -> dict[str, Card]:
        now = self._clock()
        if self._built is None or now - self._built >= self._max_age_s:
            self._cards = cards_of(
                {
                    node: state.groups or ()
                    for node in self._ledger.nodes()
                    if (state := self._ledger.get(node)) is not None
                }
            )
            self._built = now
        return self._cards

    def card(self, group: str) -> Card | None:
        return self._index().get(group)

    def cards(self, manufacturer: str) -> Sequence[Card]:
        return [c for c in self._index().values() if c.manufacturer == manufacturer]

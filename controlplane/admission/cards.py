"""The accelerator groups the worker's ledger knows: the :class:`Catalog` admission folds against.

Every replica folds the same bus events into its ledger (Kubernetes or ``standalone`` alike), so
any replica can answer a webhook. A group seen on several nodes keeps its smallest VRAM (drivers
report a few MiB apart): a MiB request that fits it fits every card of the group, and folds to
at least the share it takes of the biggest. Profiles are the union of what the group's cards
offer, each at its smallest size.

The index is rebuilt from the ledger at most every ``max_age_s`` seconds, when a request asks:
a webhook call never walks the ledger twice in a burst, and a new group is known within that age.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from bus.devices import DeviceGroup
from controlplane.admission.requests import Card
from controlplane.reconciling.labeling import product_key
from controlplane.reconciling.ledger import Ledger

__all__ = ["LedgerCatalog", "cards_of"]


def cards_of(groups: Iterable[DeviceGroup]) -> dict[str, Card]:
    """One :class:`Card` per group key, merged over every node's groups (pure)."""
    out: dict[str, Card] = {}
    for g in groups:
        if not g.memory or not g.accelerators:
            continue
        key = product_key(g)
        profiles: dict[str, int] = dict(out[key].profiles) if key in out else {}
        for a in g.accelerators:
            physical = a.status.physical_sliced
            for p in physical.profiles if physical else ():
                profiles[p.name] = min(profiles.get(p.name, p.memory_mib), p.memory_mib)
        memory = min(g.memory, out[key].memory_mib) if key in out else g.memory
        out[key] = Card(
            group=key, manufacturer=g.manufacturer, memory_mib=memory, profiles=profiles
        )
    return out


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
                g
                for node in self._ledger.nodes()
                if (state := self._ledger.get(node)) is not None
                for g in state.groups or ()
            )
            self._built = now
        return self._cards

    def card(self, group: str) -> Card | None:
        return self._index().get(group)

    def cards(self, manufacturer: str) -> Sequence[Card]:
        return [c for c in self._index().values() if c.manufacturer == manufacturer]

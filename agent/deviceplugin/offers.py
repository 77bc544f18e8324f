"""What the node offers kubelet: its cards, one servicer per served resource, and their views.

The offer side of :class:`~agent.deviceplugin.node.Node`. Given a detection pass and the modes
the ledger holds each card in, :class:`Offers` plans the servers (:func:`resources.plan_servers`),
keeps one :class:`~agent.deviceplugin.server.ResourceServicer` per (manufacturer, mode) and the
:class:`allocation.View` every decision of that resource reads. It never reads or writes the
ledger itself: the held modes are handed in, so the node decides when the offer is refreshed.

Invariants:

- ``servicers`` is one dict for the life of the node, changed in place (the registrar keeps a
  reference to it); a server whose resource is planned no more is removed from it, a new one is
  added, and an existing one keeps its servicer (and its ListAndWatch streams) and is only
  re-offered its new tokens.
- A refresh with the same cards and the same held modes as the last one changes nothing:
  every token list would come out the same (this is what keeps Allocate's hot path cheap).
- A token list that did not change keeps its spec object, so its id index is recognised by
  identity and reused, never rebuilt; only the lists that changed are re-keyed.
- A card held in some mode is kept across a detection pass that no longer lists it
  (:func:`resources.keep_held`): a held card never loses its tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from agent.deviceplugin import allocation, resources
from agent.deviceplugin.partitioning import Record
from agent.deviceplugin.server import Allocator, Key, ResourceServicer
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices

log = logging.getLogger(__name__)

_Index = tuple[tuple[resources.Token, ...], dict[str, resources.Token]]
"""A server's token list and its tokens by id."""

Recorded = Callable[[str, Sequence[str]], Record | None]
"""The MIG instance recorded for an allocation (resource, device ids), if any."""


class Offers:
    """The cards, servicers and views of one node (event-loop thread only)."""

    def __init__(
        self,
        settings: DevicePluginSettings,
        allocator: Allocator,
        *,
        recorded: Recorded | None = None,
    ) -> None:
        self._settings = settings
        self._allocator = allocator
        """What every servicer made here asks for its decisions (the node)."""
        self._recorded = recorded
        """A partitioned allocation's instance record (None: no MIG control on this node)."""
        self._cards: dict[str, resources.Card] = {}
        self._views: dict[str, allocation.View] = {}
        self._indexes: dict[str, _Index] = {}
        self._planned_for: tuple[dict[str, resources.Card], dict[str, resources.Mode]] | None = None
        self.servicers: dict[Key, ResourceServicer] = {}

    @property
    def cards(self) -> Mapping[str, resources.Card]:
        """The node's cards as last adopted (held ones kept), by id."""
        return self._cards

    def adopt(self, groups: Sequence[devices.DeviceGroup], held: dict[str, resources.Mode]) -> None:
        """Take a detection pass's cards (keeping the ``held`` ones), then refresh."""
        fresh = resources.cards_of(groups)
        self._cards = resources.keep_held(fresh, self._cards, held)
        self.refresh(held)

    def refresh(self, held: dict[str, resources.Mode]) -> None:
        """Re-plan the servers for the cards and the modes they are ``held`` in."""
        if (self._cards, held) == self._planned_for:
            return  # same cards, same modes: every token list would come out the same
        self._planned_for = (dict(self._cards), held)
        specs = resources.plan_servers(
            self._cards,
            held_modes=held,
            no_shared=self._settings.no_shared,
            no_sliced=self._settings.no_sliced,
            no_partitioned=self._settings.no_partitioned,
        )
        for key in [k for k in self.servicers if k not in specs]:
            del self.servicers[key]
        for key, spec in specs.items():
            servicer = self.servicers.get(key)
            if servicer is None:
                self.servicers[key] = ResourceServicer(spec, self._allocator)
            elif servicer.offer(spec):
                log.info("%s: %d devices re-announced", spec.resource, len(spec.tokens))
        self._reindex()

    def _reindex(self) -> None:
        """Rebuild the views, re-keying only the token lists that changed.

        A servicer keeps its spec object while its tokens stay equal, so an unchanged list is
        recognised by identity and its id index (thousands of tokens for visibility) is reused.
        """
        indexes: dict[str, _Index] = {}
        views: dict[str, allocation.View] = {}
        for servicer in self.servicers.values():
            spec = servicer.spec
            index = self._indexes.get(spec.resource)
            if index is None or index[0] is not spec.tokens:
                index = (spec.tokens, {t.id: t for t in spec.tokens})
            indexes[spec.resource] = index
            views[spec.resource] = allocation.View(
                mode=spec.mode, resource=spec.resource, tokens=index[1], cards=self._cards
            )
        self._indexes, self._views = indexes, views

    def view(self, key: Key) -> allocation.View:
        """The view of the server ``key`` (:raises KeyError: no such server is offered)."""
        return self._views[resources.resource_name(*key)]

    def serves(self, resource: str) -> bool:
        """Whether ``resource`` is one of the resources offered now."""
        return resource in self._views

    def resolve(
        self, resource: str, device_ids: Sequence[str]
    ) -> tuple[resources.Mode, tuple[tuple[str, int], ...]] | None:
        """(mode, charges) of an allocation; a partitioned one is charged on the card its
        recorded instance lives on, not on its tokens' cards."""
        record = self._recorded(resource, device_ids) if self._recorded else None
        view = self._views.get(resource)
        card = self._cards.get(record.card_id) if record is not None else None
        if view is not None and card is not None:
            holding = allocation.partition_holding(view, device_ids, card, now=0.0)
            return view.mode, holding.charges
        return allocation.resolve(self._views, resource, device_ids)

    def partitioned_cards(self) -> list[str]:
        """The ids of the cards that have MIG partitions (what reclaim looks at)."""
        return [c.id for c in self._cards.values() if c.partition_count > 0]

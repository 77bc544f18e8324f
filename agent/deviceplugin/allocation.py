"""Allocate and GetPreferredAllocation decisions: pure functions of tokens, cards and the ledger.

Allocate (:func:`decide`) validates every device id before anything is charged, so a refused
request leaves the ledger as it was. GetPreferredAllocation (:func:`prefer`) is advisory: it
keeps a request on one NUMA node where it can, never offers a card held in another mode, and for
sliced and partitioned requests packs onto the most-occupied card that still fits, so whole cards
stay free for exclusive work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from agent.deviceplugin import errors, pending
from agent.deviceplugin.holdings import Holding, Ledger, allocation_id
from agent.deviceplugin.limits import shown
from agent.deviceplugin.resources import (
    UNITS_PER_CARD,
    Card,
    Mode,
    Token,
    is_well_formed,
    units_per_token,
)
from bus.records import PendingContainer


@dataclass(frozen=True)
class View:
    """One server's tokens and the node's cards, as the decisions see them."""

    mode: Mode
    resource: str
    tokens: Mapping[str, Token]
    cards: Mapping[str, Card]


@dataclass(frozen=True)
class Grant:
    """What one container receives: per card (ascending index) the token indexes it got."""

    mode: Mode
    cards: tuple[tuple[Card, tuple[int, ...]], ...]
    holding: Holding | None
    """None for visibility, which charges nothing."""
    stale: tuple[str, ...] = ()
    """Allocation ids this grant proves gone (they held one of its device ids)."""
    request: PendingContainer | None = None
    """The pending container a sliced grant serves: its own caps and charge, not a token
    share (:mod:`pending`)."""


def card_name(card: Card) -> str:
    return f"{card.id} ({card.group} #{card.index})"


def decide(
    view: View,
    device_ids: Sequence[str],
    ledger: Ledger,
    *,
    now: float,
    request: PendingContainer | None = None,
) -> Grant:
    """Check a container's device ids and say what it gets; the caller charges the holding.

    ``request``: the pending container a sliced Allocate serves; it is charged its own units
    (:func:`pending.sliced_charges`), gated first (:func:`pending.sliced_gate`).

    :raises errors.BadRequest: an id is malformed, repeated or not one of this server's tokens.
    :raises errors.Conflict: a card is held in another mode, unhealthy, or named twice
        (shared); a sliced ``request`` finds no free slot or too few units.
    :raises errors.Exhausted: a card lacks the free units.
    """
    per_card = _tokens_per_card(view, device_ids)
    cards = sorted((view.cards[c] for c in per_card), key=lambda c: (c.index, c.id))
    grants = tuple((c, tuple(sorted(per_card[c.id]))) for c in cards)
    for card in cards:
        if card.unhealthy:
            raise errors.Conflict(f"card {card_name(card)} is unhealthy")
        if view.mode == "shared" and len(per_card[card.id]) > 1:
            raise errors.Conflict(f"card {card_name(card)} named twice in one shared request")
    if view.mode == "visibility":
        return Grant(mode=view.mode, cards=grants, holding=None)
    existing = ledger.holder(view.resource, device_ids)
    if existing is not None:  # kubelet retrying the same container: same answer, no new charge
        return Grant(mode=view.mode, cards=grants, holding=existing, request=request)
    stale = tuple(h.allocation_id for h in ledger.stale(view.resource, device_ids))
    if request is not None and view.mode == "sliced":
        charges = _sliced_charges(view, per_card, ledger, request, ignoring=stale)
    else:  # a named exclusive or shared container is charged its tokens, and named
        charges = {c.id: len(per_card[c.id]) * units_per_token(c, view.mode) for c in cards}
    ledger.check(view.mode, charges, {c.id: card_name(c) for c in cards}, ignoring=stale)
    holding = Holding(
        allocation_id=allocation_id(view.resource, device_ids),
        resource=view.resource,
        mode=view.mode,
        device_ids=tuple(sorted(device_ids)),
        charges=tuple(charges.items()),
        since=now,
    )
    if request is not None:
        holding = served(holding, request, cards)
    return Grant(mode=view.mode, cards=grants, holding=holding, stale=stale, request=request)


def served(holding: Holding, request: PendingContainer, cards: Sequence[Card]) -> Holding:
    """``holding`` naming the container it serves and the caps its injection writes, so the
    allocation event carries them (the worker annotates the Pod from it)."""
    memory = None
    if request.memory_percentage is not None or request.memory_mib is not None:
        sized = [c.memory_mib for c in cards if c.memory_mib]
        memory = min((pending.memory_cap_mib(request, m) for m in sized), default=None)
    return replace(
        holding,
        pod_uid=request.pod_uid,
        pod_namespace=request.namespace,
        pod_name=request.pod,
        container=request.container,
        memory_mib=memory if holding.mode == "sliced" else None,
        cores_percentage=pending.cores_percentage(request) if holding.mode == "sliced" else None,
        profile=request.profile if holding.mode == "partitioned" else None,
    )


def _sliced_charges(
    view: View,
    per_card: Mapping[str, Sequence[int]],
    ledger: Ledger,
    request: PendingContainer,
    *,
    ignoring: Sequence[str],
) -> dict[str, int]:
    """``request``'s units on each card, once every card passed the sliced gate."""
    charges = pending.sliced_charges(request, {c: len(ts) for c, ts in per_card.items()})
    for card_id, charge in charges.items():
        card = view.cards[card_id]
        pending.sliced_gate(
            card_name(card),
            charge=charge,
            remaining=ledger.remaining(card_id) + _freed(ledger, card_id, ignoring),
            slices_held=slices_held(view, ledger, card_id, ignoring=ignoring),
            slice_count=card.sliced_count,
        )
    return charges


def _freed(ledger: Ledger, card_id: str, stale: Sequence[str]) -> int:
    """The units the ``stale`` holdings charge on ``card_id`` (a new grant replaces them)."""
    return sum(u for h in ledger.holdings() if h.allocation_id in stale
               for c, u in h.charges if c == card_id)  # fmt: skip


def slices_held(view: View, ledger: Ledger, card_id: str, *, ignoring: Sequence[str] = ()) -> int:
    """How many of ``card_id``'s tokens of ``view``'s resource the ledger's holdings hold."""
    return sum(
        1
        for h in ledger.holdings()
        if h.resource == view.resource and h.allocation_id not in ignoring
        for d in h.device_ids
        if (t := view.tokens.get(d)) is not None and t.card == card_id
    )


def partition_request(view: View, device_ids: Sequence[str]) -> int:
    """Validate a partitioned request; its token count (the tokens are fungible: their cards
    do not say where the instance goes, see :mod:`partitions`).

    :raises errors.BadRequest: an id is malformed, repeated or not one of this server's tokens.
    """
    per_card = _tokens_per_card(view, device_ids)
    return sum(len(indexes) for indexes in per_card.values())


def partition_holding(
    view: View,
    device_ids: Sequence[str],
    card: Card,
    *,
    now: float,
    request: PendingContainer | None = None,
) -> Holding:
    """The holding of a partitioned allocation whose instance lives on ``card``: the
    container's own ``.partitioned.units`` (its profile's memory folded) when ``request`` says,
    else the tokens' share."""
    units = len(device_ids) * units_per_token(card, view.mode)
    if request is not None:
        units = request.units
    holding = Holding(
        allocation_id=allocation_id(view.resource, device_ids),
        resource=view.resource,
        mode=view.mode,
        device_ids=tuple(sorted(device_ids)),
        charges=((card.id, min(units, UNITS_PER_CARD)),),
        since=now,
    )
    return served(holding, request, [card]) if request is not None else holding


def _tokens_per_card(view: View, device_ids: Sequence[str]) -> dict[str, list[int]]:
    if not device_ids:
        raise errors.BadRequest(f"no device ids in a request for {view.resource}")
    per_card: dict[str, list[int]] = {}
    for device in device_ids:
        if not is_well_formed(device):
            raise errors.BadRequest(f"malformed device id {shown(device)}")
        token = view.tokens.get(device)
        if token is None or token.card not in view.cards:
            raise errors.BadRequest(f"unknown device id {shown(device)} for {view.resource}")
        if token.index in per_card.get(token.card, []):
            raise errors.BadRequest(f"device id {shown(device)} named twice")
        per_card.setdefault(token.card, []).append(token.index)
    return per_card


def resolve(
    views: Mapping[str, View], resource: str, device_ids: Sequence[str]
) -> tuple[Mode, tuple[tuple[str, int], ...]] | None:
    """(mode, charges) of a past allocation, or None if it names no token we serve now."""
    view = views.get(resource)
    if view is None or view.mode == "visibility":
        return None
    counts: dict[str, int] = {}
    for device in device_ids:
        token = view.tokens.get(device)
        if token is None or token.card not in view.cards:
            return None
        counts[token.card] = counts.get(token.card, 0) + 1
    charges = tuple((c, n * units_per_token(view.cards[c], view.mode)) for c, n in counts.items())
    return view.mode, charges


# ------------------------------------------------------------------ GetPreferredAllocation


def prefer(
    view: View,
    ledger: Ledger,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    charge: int | None = None,
) -> list[str]:
    """The device ids to suggest for one container; empty means "no preference".

    Must-include ids come first. Cards held in another mode or unhealthy are never suggested.
    ``charge``: the units a sliced container will be charged per card (its pending request);
    a card with fewer remaining units or no free slot is then deferred.
    """
    if view.mode == "visibility" or size <= 0:
        return []
    chosen = [d for d in must_include if d in view.tokens]
    need = size - len(chosen)
    if need <= 0:
        return chosen[:size]
    usable = [
        view.tokens[d]
        for d in available
        if d in view.tokens and d not in chosen and _usable(view, ledger, view.tokens[d].card)
    ]
    anchor = {n for d in chosen for n in view.tokens[d].numa_nodes}
    if view.mode in ("exclusive", "shared"):
        taken = {view.tokens[d].card for d in chosen} if view.mode == "shared" else set()
        picked = _spread(view, usable, need, anchor, taken)
    else:
        home = [view.tokens[d].card for d in chosen]
        picked = _pack(view, ledger, usable, need, home, charge)
    return chosen + [t.id for t in picked]


def _usable(view: View, ledger: Ledger, card_id: str) -> bool:
    card = view.cards.get(card_id)
    held = ledger.mode_of(card_id)
    return card is not None and not card.unhealthy and held in (None, view.mode)


def _numa_key(token: Token) -> int:
    return token.numa_nodes[0] if token.numa_nodes else -1


def _spread(
    view: View, usable: Iterable[Token], need: int, anchor: set[int], taken: set[str]
) -> list[Token]:
    """One token per card, all on one NUMA node when one has room (the tightest that fits)."""
    first: dict[str, Token] = {}
    for token in sorted(usable, key=lambda t: (view.cards[t.card].index, t.index)):
        if token.card not in taken:
            first.setdefault(token.card, token)
    by_node: dict[int, list[Token]] = {}
    for token in first.values():
        by_node.setdefault(_numa_key(token), []).append(token)
    fitting = [n for n, ts in by_node.items() if len(ts) >= need]
    if fitting:
        best = min(fitting, key=lambda n: (n not in anchor, len(by_node[n]), n))
        return by_node[best][:need]
    order = sorted(by_node, key=lambda n: (n not in anchor, -len(by_node[n]), n))
    return [t for n in order for t in by_node[n]][:need]


def _pack(
    view: View,
    ledger: Ledger,
    usable: Iterable[Token],
    need: int,
    home: Sequence[str],
    charge: int | None = None,
) -> list[Token]:
    """Fill the most-occupied card that still fits; spill over cards on the same NUMA node."""
    per_card: dict[str, list[Token]] = {}
    for token in sorted(usable, key=lambda t: t.index):
        per_card.setdefault(token.card, []).append(token)

    def fits(card_id: str) -> bool:
        card = view.cards[card_id]
        if charge is not None:
            slots = card.sliced_count
            free_slot = not slots or slices_held(view, ledger, card_id) < slots
            return free_slot and ledger.remaining(card_id) >= min(charge * need, UNITS_PER_CARD)
        return ledger.remaining(card_id) >= need * units_per_token(card, view.mode)

    def occupancy(card_id: str) -> tuple[bool, int, int]:
        return (card_id not in home, -ledger.used(card_id), view.cards[card_id].index)

    whole = [c for c in per_card if len(per_card[c]) >= need and fits(c)]
    if whole:
        return per_card[min(whole, key=occupancy)][:need]
    order = sorted(per_card, key=occupancy)
    if not order:
        return []
    numa = _numa_key(per_card[order[0]][0])
    order.sort(key=lambda c: (_numa_key(per_card[c][0]) != numa, *occupancy(c)))
    return [t for c in order for t in per_card[c]][:need]

"""The folds of the request model: a claim's units, and the shared-card pin. Pure.

Both webhooks call these: the mutating one writes what they compute, the validating one checks
the Pod carries exactly that, and refuses with the errors when a fold cannot be made. So the
arithmetic and its messages exist once.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.admission.pods import Pod, Requirement, Slot, Term
from controlplane.admission.requests import (
    GROUP_PREFIX,
    Catalog,
    Claim,
    Fold,
    candidates,
    field,
    forbidden,
    group_manufacturer,
    invalid,
    mib_units,
    percent_units,
    read_int,
    required,
    selector_groups,
    term_groups,
)

__all__ = [
    "is_pinned",
    "partition_units",
    "pinned_terms",
    "shared_problem",
    "sliced_units",
]

_NAME_IT = f'name it with a node selector {GROUP_PREFIX}<group>: "true"'


def sliced_units(slot: Slot, claim: Claim, groups: Sequence[str], catalog: Catalog) -> Fold:
    """``<base>.sliced.units`` from the claim's one memory budget."""
    pct_key, mib_key = claim.key(".sliced.memory-percentage"), claim.key(".sliced.memory-mib")
    has_pct, has_mib = pct_key in claim.values, mib_key in claim.values
    if not has_pct and not has_mib:
        detail = f"a {claim.key('.sliced')} request must set {pct_key} or {mib_key}"
        return Fold(None, (required(field(slot), detail),))
    if has_pct and has_mib:
        return Fold(None, (forbidden(field(slot), f"cannot set both {pct_key} and {mib_key}"),))
    if has_pct:
        pct, errors = read_int(slot, claim, pct_key)
        if pct is None:
            return Fold(None, errors)
        if not 0 < pct <= 100:
            return Fold(None, (invalid(field(slot, pct_key), claim.values[pct_key], _PERCENT),))
        return Fold(percent_units(pct))
    return _mib_units(slot, claim, groups, catalog)


_PERCENT = "must be within (0, 100]"


def _mib_units(slot: Slot, claim: Claim, groups: Sequence[str], catalog: Catalog) -> Fold:
    key = claim.key(".sliced.memory-mib")
    mib, errors = read_int(slot, claim, key)
    if mib is None:
        return Fold(None, errors)
    path, raw = field(slot, key), claim.values[key]
    if mib <= 0:
        return Fold(None, (invalid(path, raw, "must be greater than 0"),))
    card = _vram(claim, groups, catalog)
    if isinstance(card, str):
        return Fold(None, (invalid(path, raw, card),))
    if mib > card:
        return Fold(None, (invalid(path, raw, f"must not exceed the per-card VRAM ({card} MiB)"),))
    units = mib_units(mib, card)
    if units <= 0:
        return Fold(None, (invalid(path, raw, f"folds to 0 units on a card of {card} MiB"),))
    return Fold(units)


def _vram(claim: Claim, groups: Sequence[str], catalog: Catalog) -> int | str:
    """The card's MiB, or why it is not known (a suggestion to use the percentage)."""
    mfr = claim.manufacturer
    cards = [c for g in groups if (c := catalog.card(g)) is not None and c.manufacturer == mfr]
    instead = f"or request {claim.key('.sliced.memory-percentage')} instead"
    if not cards:
        return (
            "cannot fold MiB into units: the card's VRAM is unknown, because the Pod names no "
            f"known accelerator group; {_NAME_IT}, {instead}"
        )
    disputed = [c.group for c in cards if c.memory_mib is None]
    if disputed:
        return (
            f"cannot fold MiB into units: the nodes of {', '.join(disputed)} do not agree on its "
            f"VRAM (no majority reports one size); {instead}"
        )
    sizes = {c.memory_mib for c in cards if c.memory_mib is not None}
    if len(sizes) > 1:
        named = ", ".join(f"{c.group} ({c.memory_mib} MiB)" for c in cards)
        return f"cannot fold MiB into units: the named accelerator groups differ in VRAM: {named}; {instead}"
    return sizes.pop()


def partition_units(slot: Slot, claim: Claim, groups: Sequence[str], catalog: Catalog) -> Fold:
    """``<base>.partitioned.units`` from the one profile's memory on its card. A claim with no
    profile or several gets ``Fold(None)``: the request rules say what is wrong with it."""
    profiles = claim.profiles()
    if len(profiles) != 1:
        return Fold(None)
    key, profile = profiles[0]
    offering = [c for c in candidates(claim, groups, catalog) if profile in c.profiles]
    folds = {
        c.group: mib_units(c.profiles[profile], c.memory_mib)
        for c in offering
        if c.memory_mib is not None  # nodes that disagree on the card cannot size the share
    }
    raw = claim.values[key]
    if not folds:
        detail = f"no known accelerator group offers partition profile {profile}"
        return Fold(None, (invalid(field(slot, key), raw, detail),))
    if len(set(folds.values())) > 1:
        shares = ", ".join(f"{g} ({u} units)" for g, u in sorted(folds.items()))
        detail = (
            f"partition profile {profile} is a different share of the card on {shares}; {_NAME_IT}"
        )
        return Fold(None, (invalid(field(slot, key), raw, detail),))
    return Fold(next(iter(folds.values())))


def _pin(group: str, cards: int) -> Requirement:
    return Requirement(key=f"{GROUP_PREFIX}{group}.count", operator="Gt", values=[str(cards - 1)])


def is_pinned(term: Term, cards: int) -> bool:
    """Whether the term only selects nodes with at least ``cards`` cards of a group."""
    return any(
        r.key.startswith(GROUP_PREFIX)
        and r.key.endswith(".count")
        and r.operator == "Gt"
        and len(r.values or ()) == 1
        and (r.values or [""])[0].isdigit()
        and int((r.values or ["0"])[0]) >= cards - 1
        for r in term.match_expressions or ()
    )


def pinned_terms(pod: Pod, manufacturer: str, catalog: Catalog, cards: int) -> list[Term] | None:
    """The required terms with the card-count pin in each; None when nothing changes.

    Terms are ORed, so each is pinned on the groups it can reach: those the node selector names
    (it applies to every term), else those the term names, else every group of the manufacturer
    the catalog knows, one copy of the term per group. A term with no group to pin stays as it
    is, and the validating webhook refuses the Pod.
    """
    selected = [g for g in selector_groups(pod) if group_manufacturer(g) == manufacturer]
    known = sorted(c.group for c in catalog.cards(manufacturer))
    out: list[Term] = []
    for term in pod.required_terms() or [Term()]:
        named = [g for g in term_groups(term) if group_manufacturer(g) == manufacturer]
        groups = [] if is_pinned(term, cards) else selected or named or known
        out += [
            Term(
                match_expressions=[*(term.match_expressions or ()), _pin(group, cards)],
                match_fields=term.match_fields,
            )
            for group in groups
        ] or [term]
    return None if out == (pod.required_terms() or [Term()]) else out


def shared_problem(base: str, cards: int) -> str:
    """Why a shared request of ``cards`` is refused when its terms carry no pin."""
    where = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    return required(
        where,
        f"a {base}.shared request of {cards} needs nodes with at least {cards} cards, so every "
        f"required node-affinity term must carry {GROUP_PREFIX}<group>.count Gt {cards - 1}; "
        f"the mutating webhook adds it for the accelerator groups it knows, and knows none here: "
        f"{_NAME_IT}",
    )

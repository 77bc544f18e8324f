"""MIG decisions, pure: which profile a request gets, where it goes, and which instances to reclaim.

**Profile choice.** kubelet's Allocate names only device ids, so the profile is the one the
container's own limit ``<base>.partitioned.<kind>-<profile>`` names, learnt from the pending record
the worker publishes (:mod:`pending`). Only without a name (a direct caller, preflight) does it
come from how many ``<base>.partitioned`` tokens the container asked for. A card advertises ``physicalSliced.count``
tokens (the largest ``instanceCount`` of its profiles: 7 on an H100, one per compute slice), so
one token is one ``1/count`` share of the card's compute slices. ``k`` tokens get one instance of
the smallest profile whose compute slices cover ``ceil(k × slices / count)``: on an H100 1 token
is ``1g.10gb``, 2 are ``2g.20gb``, 3 are ``3g.40gb``, 4 are ``4g.40gb`` and 5 to 7 are
``7g.80gb``. "Smallest" orders by compute slices, then memory slices, so ``1g.10gb`` wins over
``1g.20gb``. Media-extension profiles (``+me``) and profiles without a placement are never
chosen. The tokens are fungible: their card is not where the instance goes (the reference does
the same); the ledger charges ``k`` tokens' units on the card actually chosen.

**Placement.** A GPU instance occupies the memory slices ``[start, start + size)`` of one of its
profile's legal placements. It fits a card when those slices are free, the profile is below its
``instanceCount`` and the card has the compute slices left. Among MIG-enabled healthy cards where
it fits, the most-occupied card (most memory slices taken; ties by lower index) is packed first,
so whole cards stay free for the big profiles; on that card the lowest free legal start is taken
(first fit). A card with MIG off is never chosen.

**Reclaim** (:func:`plan_reclaim`) is level-based: an instance recorded for an allocation the
ledger no longer holds and that this process saw released is destroyed at once; any other
instance no allocation accounts for (an orphan: created outside us, or recorded by an earlier run
whose allocation the bus forgot) only after it stayed unaccounted for ``debounce_s``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.devices.libs.nvml import GpuInstanceProfile


@dataclass(frozen=True)
class Occupied:
    """One existing (or reserved) GPU instance on a card."""

    profile_id: int
    start: int
    size: int
    compute_slices: int


@dataclass(frozen=True)
class CardState:
    """One partitioned card as placement sees it."""

    card_id: str
    index: int
    mig_enabled: bool
    healthy: bool
    token_count: int
    """``physicalSliced.count``: the card's partitioned tokens."""
    profiles: tuple[GpuInstanceProfile, ...]
    occupied: tuple[Occupied, ...] = ()


@dataclass(frozen=True)
class Choice:
    card_id: str
    profile: GpuInstanceProfile
    start: int
    size: int


def usable_profiles(profiles: Iterable[GpuInstanceProfile]) -> list[GpuInstanceProfile]:
    return [p for p in profiles if p.placements and "+" not in p.name]


def profile_for(
    card: CardState, tokens: int, named: str | None = None
) -> GpuInstanceProfile | None:
    """The profile ``named`` (the container's own limit) when given; else the smallest whose
    compute slices cover ``tokens`` of the card's tokens."""
    usable = usable_profiles(card.profiles)
    if named is not None:
        return next((p for p in usable if p.name == named), None)
    if not usable or card.token_count <= 0 or tokens <= 0 or tokens > card.token_count:
        return None
    total = max(p.slice_count for p in usable)
    share = -(-tokens * total // card.token_count)
    fitting = [p for p in usable if p.slice_count >= share]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.slice_count, p.placements[0][1], p.memory_mib, p.index))


def taken_slices(card: CardState) -> set[int]:
    return {s for o in card.occupied for s in range(o.start, o.start + o.size)}


def first_fit(card: CardState, profile: GpuInstanceProfile) -> tuple[int, int] | None:
    """The lowest free legal placement of ``profile`` on ``card``, or None."""
    usable = usable_profiles(card.profiles)
    total = max((p.slice_count for p in usable), default=0)
    compute = sum(o.compute_slices for o in card.occupied)
    same = sum(1 for o in card.occupied if o.profile_id == profile.index)
    if same >= profile.instance_count or compute + profile.slice_count > total:
        return None
    taken = taken_slices(card)
    for start, size in sorted(profile.placements):
        if not taken & set(range(start, start + size)):
            return (start, size)
    return None


def choose(cards: Iterable[CardState], tokens: int, named: str | None = None) -> Choice | None:
    """Pack the most-occupied card that fits; first fit on it. None: no card can host it.

    ``named``: the profile the container asked for; cards that do not offer it are skipped.
    """
    best: tuple[tuple[int, int], Choice] | None = None
    for card in cards:
        if not card.mig_enabled or not card.healthy:
            continue
        profile = profile_for(card, tokens, named)
        where = first_fit(card, profile) if profile is not None else None
        if profile is None or where is None:
            continue
        rank = (-len(taken_slices(card)), card.index)
        if best is None or rank < best[0]:
            best = (rank, Choice(card.card_id, profile, *where))
    return best[1] if best else None


# ------------------------------------------------------------------ reclaim


@dataclass(frozen=True)
class Instance:
    """One GPU instance found on a card, with the MIG devices (compute instances) inside it."""

    card_id: str
    gpu_instance_id: int
    mig_uuids: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        return (self.card_id, self.gpu_instance_id)


@dataclass(frozen=True)
class ReclaimPlan:
    destroy: tuple[Instance, ...]
    unaccounted_since: dict[tuple[str, int], float]
    """When each still-kept unaccounted instance was first seen so (carry to the next tick)."""


def plan_reclaim(
    found: Sequence[Instance],
    *,
    owners: Mapping[tuple[str, int], str],
    held: Collection[str],
    released: Collection[str],
    busy: Collection[tuple[str, int]],
    unaccounted_since: Mapping[tuple[str, int], float],
    now: float,
    debounce_s: float,
) -> ReclaimPlan:
    """Which instances to destroy now.

    ``owners`` maps recorded instances to their allocation id, ``held`` is the allocation ids the
    ledger holds, ``released`` those this process saw released, ``busy`` instances being created
    or destroyed right now (never touched).
    """
    destroy: list[Instance] = []
    since: dict[tuple[str, int], float] = {}
    for instance in found:
        owner = owners.get(instance.key)
        if instance.key in busy or (owner is not None and owner in held):
            continue
        if owner is not None and owner in released:
            destroy.append(instance)
            continue
        first = unaccounted_since.get(instance.key, now)
        if now - first >= debounce_s:
            destroy.append(instance)
        else:
            since[instance.key] = first
    return ReclaimPlan(destroy=tuple(destroy), unaccounted_since=since)

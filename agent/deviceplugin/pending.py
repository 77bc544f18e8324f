"""Which pending container a sliced Allocate is for, and what that container may use: pure.

kubelet's Allocate names device IDs only. The worker publishes each node's pending sliced and
partitioned containers (:class:`bus.records.PendingContainers`); :func:`choose` picks the one this
call serves (kubelet's pod-resources view first, else the oldest feasible pending one, §3.5 step
3), and :func:`sliced_charges` / :func:`sliced_gate` / :func:`memory_cap_mib` turn its request
into the ledger charge and the caps the injection writes, instead of "tokens / slice count".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from agent.deviceplugin import errors
from agent.deviceplugin.resources import UNITS_PER_CARD
from bus.records import PendingContainer

__all__ = [
    "ContainerKey",
    "choose",
    "cores_percentage",
    "memory_cap_mib",
    "sliced_charges",
    "sliced_gate",
]

ContainerKey = tuple[str, str]
"""``(pod uid, container name)``."""


def choose(
    pending: Sequence[PendingContainer],
    resource: str,
    size: int,
    *,
    by_kubelet: Collection[ContainerKey] = (),
    reserved: Collection[ContainerKey] = (),
    remaining: Mapping[str, int] | None = None,
) -> PendingContainer | None:
    """The container this Allocate of ``size`` devices of ``resource`` is for; None: unknown.

    ``by_kubelet``: the containers kubelet's pod-resources shows waiting for this resource (it
    knows which container it allocates for, so one of them wins). Else the oldest pending one
    that fits the offered cards' ``remaining`` units; all infeasible: the oldest still.
    """
    candidates = [
        p for p in pending
        if p.resource == resource and p.count == size and (p.pod_uid, p.container) not in reserved
    ]  # fmt: skip
    candidates.sort(key=lambda p: p.created_at)
    named = [p for p in candidates if (p.pod_uid, p.container) in by_kubelet]
    if named:
        return named[0]
    free = max(remaining.values(), default=0) if remaining is not None else None
    feasible = [p for p in candidates if free is None or p.units <= free]
    return next(iter(feasible or candidates), None)


def sliced_charges(request: PendingContainer, tokens: Mapping[str, int]) -> dict[str, int]:
    """Per card, the container's units times its tokens there, at most a whole card."""
    return {card: min(request.units * n, UNITS_PER_CARD) for card, n in tokens.items()}


def sliced_gate(
    name: str, *, charge: int, remaining: int, slices_held: int, slice_count: int
) -> None:
    """Refuse a slice the card cannot take: kubelet shows the Pod ``UnexpectedAdmissionError``
    rather than the container starting with less memory than it asked.

    :raises errors.Conflict: no free slot on the card, or fewer remaining units than asked.
    """
    if slice_count and slices_held >= slice_count:
        raise errors.Conflict(f"card {name} has no free slice ({slices_held} of {slice_count})")
    if remaining < charge:
        raise errors.Conflict(f"card {name} has {remaining} units left, {charge} asked")


def memory_cap_mib(request: PendingContainer, card_mib: int) -> int:
    """The container's memory cap on a card of ``card_mib``: its percentage wins, else its MiB,
    both capped at the card.

    :raises errors.CannotInject: the request names neither.
    """
    if request.memory_percentage is not None:
        return min(card_mib, card_mib * request.memory_percentage // 100)
    if request.memory_mib is not None:
        return min(card_mib, request.memory_mib)
    raise errors.CannotInject(f"{request.namespace}/{request.pod} names no sliced memory")


def cores_percentage(request: PendingContainer) -> int:
    """The SM/CU cap in percent: what the container asked, 100 when it asked nothing."""
    return max(1, min(100, request.cores_percentage or 100))

"""Visibility: a sidecar sees exactly what its Pod's owning container holds, or nothing: pure.

A visibility request (``device.gpustack.ai/<mfr>.visibility: N``, the SSH sidecar's) is never
given cards of its own choosing: kubelet's tokens for it are interchangeable (512 per card), so
the cards they sit on say nothing. The sidecar is identified by its pending claim (the worker
lists a mirrored Pod's visibility and whole-card claims, :mod:`bus.records`), and
:func:`mirror` finds the holdings of the other containers of the same Pod in the ledger:

- a partitioned owner is mirrored as its partition (the MIG instance's UUID), never the parent
  card, whose other partitions belong to other Pods;
- otherwise the owner's cards, which must all still be on the node and number exactly ``N``.

Anything else fails closed (:class:`errors.Conflict`, kubelet's FailedPrecondition): no owner
allocated yet, an owner of another manufacturer, a card gone, a count that differs. A sidecar
started with an empty or a guessed device list would see cards it must not, or none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.deviceplugin import errors
from agent.deviceplugin.holdings import Holding
from agent.deviceplugin.resources import Card
from bus.records import PendingContainer

__all__ = ["Mirror", "mirror"]


@dataclass(frozen=True)
class Mirror:
    """What the sidecar is given: its owner's cards (ascending index), or its partition."""

    cards: tuple[Card, ...] = ()
    partition_id: str | None = None


def mirror(
    claim: PendingContainer,
    holdings: Iterable[Holding],
    cards: Mapping[str, Card],
    *,
    manufacturer: str,
    size: int,
) -> Mirror:
    """The owner's share of ``claim``'s Pod, for a visibility request of ``size`` tokens.

    :raises errors.Conflict: fail closed (see the module docstring).
    """
    who = f"{claim.namespace}/{claim.pod} container {claim.container}"
    owners = [
        h
        for h in holdings
        if h.pod_uid == claim.pod_uid and h.container != claim.container and h.mode != "visibility"
    ]
    if not owners:
        raise errors.Conflict(
            f"{who}: no other container of its Pod holds a {manufacturer} device on this node "
            "yet; a visibility request only mirrors its owner"
        )
    partitions = [h.partition_id for h in owners if h.mode == "partitioned"]
    if partitions:
        if len(owners) > 1 or partitions[0] is None:
            raise errors.Conflict(f"{who}: its owner's partition is not known; refused")
        return Mirror(partition_id=partitions[0])
    held = list(dict.fromkeys(c for h in owners for c, _ in h.charges))
    gone = [c for c in held if c not in cards]
    if gone:
        raise errors.Conflict(f"{who}: the card {gone[0]} its owner holds is no longer here")
    found = sorted((cards[c] for c in held), key=lambda c: (c.index, c.id))
    if any(c.manufacturer != manufacturer for c in found):
        raise errors.Conflict(f"{who}: its owner holds no {manufacturer} card")
    if len(found) != size:
        raise errors.Conflict(
            f"{who} asks to see {size} card(s); its owner holds {len(found)}: refused"
        )
    return Mirror(cards=tuple(found))

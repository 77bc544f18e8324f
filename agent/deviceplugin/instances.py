"""The MIG instance behind a partitioned Allocate: the claim waited for, the instance made or reused.

A partitioned grant is not a set of tokens but one MIG instance of the profile its container
asks for. :class:`Instances` finds that instance for an Allocate: the one recorded for the same
allocation (a kubelet retry, or an allocation adopted after a restart), else a new one created
through :class:`~agent.deviceplugin.partitioning.Partitions` once the container's claim is known.
The worker publishes a Pod's claim within a second or so of its binding, which may come after
kubelet's Allocate, so a new instance first waits up to ``wait_s`` for the claim
(:meth:`Claims.wait_for`, woken by each change, never polling).

The node (:class:`~agent.deviceplugin.node.Node`) keeps the ledger: it asks :meth:`Instances.get`
for the instance and the claim, then charges the holding itself, so nothing here writes the ledger
and a failure before the charge leaves it as it was.

Invariants: the claim is reserved before the instance is created (creating awaits, and a second
Allocate must not take the same claim meanwhile) and released again when the creation fails or is
cancelled; a cancelled wait reserves nothing. The decisions (:func:`recorded`,
:func:`partitionable`, :func:`refusal`) are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.deviceplugin import allocation, errors, resources
from agent.deviceplugin import holdings as ledger
from agent.deviceplugin.claims import Claims
from agent.deviceplugin.partitioning import Partitions, Record
from bus.records import PendingContainer

__all__ = ["MIG_MANUFACTURER", "Instances", "partitionable", "recorded", "refusal"]

MIG_MANUFACTURER = "nvidia"
"""The one manufacturer whose partitions this plugin creates (MIG control is NVML's)."""


def recorded(
    records: Mapping[str, Record], resource: str, device_ids: Sequence[str]
) -> Record | None:
    """The instance recorded for this allocation; None when none is, or when the record's
    tokens are not exactly these (another request that happens to share an allocation id)."""
    if not device_ids:
        return None
    record = records.get(ledger.allocation_id(resource, device_ids))
    return record if record is not None and set(record.device_ids) == set(device_ids) else None


def partitionable(cards: Mapping[str, resources.Card], manufacturer: str) -> list[resources.Card]:
    """The cards of ``manufacturer`` an instance may be placed on (those with partitions)."""
    return [c for c in cards.values() if c.manufacturer == manufacturer and c.partition_count > 0]


def refusal(request: PendingContainer | None, resource: str, size: int) -> str | None:
    """Why a new partitioned Allocate of ``size`` tokens is refused after its wait (None: it
    goes on): no pending container asks for it, or the one that does names no profile (never a
    guessed profile; kubelet shows the Pod ``UnexpectedAdmissionError``)."""
    if request is None:
        return (
            f"no pending container on this node asks for {size} {resource}; "
            "its partition profile is unknown"
        )
    if not request.profile:
        return (
            f"{request.namespace}/{request.pod} container {request.container} names no "
            f"partition profile ({resource}.<kind>-<profile>: 1)"
        )
    return None


class Instances:
    """Finds or creates the instance of a partitioned Allocate (event-loop thread only)."""

    def __init__(self, partitions: Partitions, claims: Claims, *, wait_s: float) -> None:
        self.partitions = partitions
        self._claims = claims
        self._wait_s = wait_s

    def recorded(self, resource: str, device_ids: Sequence[str]) -> Record | None:
        return recorded(self.partitions.records, resource, device_ids)

    async def get(
        self,
        view: allocation.View,
        device_ids: Sequence[str],
        cards: Mapping[str, resources.Card],
    ) -> tuple[Record, PendingContainer | None]:
        """The instance this allocation gets and the claim it serves (None: an adopted
        allocation no claim was reserved for).

        :raises errors.BadRequest: the ids are not this server's tokens.
        :raises errors.Conflict: its instance is being created (retry), or no usable claim.
        :raises errors.Exhausted: no card can host it.
        """
        allocation.partition_request(view, device_ids)
        alloc = ledger.allocation_id(view.resource, device_ids)
        record = self.recorded(view.resource, device_ids)
        if record is not None:
            return record, self._claims.reserved(alloc)
        if self.partitions.pending(alloc):
            raise errors.Conflict(f"the instance of {alloc} is being created; retry")
        request = await self._claims.wait_for(view.resource, len(device_ids), self._wait_s)
        problem = refusal(request, view.resource, len(device_ids))
        if problem is not None:
            raise errors.Conflict(problem)
        assert request is not None  # refusal() answered for a missing claim
        self._claims.reserve(alloc, request)  # reserved now: creating the instance awaits
        try:
            record = await self.partitions.create(
                alloc, view.resource, device_ids, partitionable(cards, MIG_MANUFACTURER),
                profile=request.profile,
            )  # fmt: skip
        except BaseException:
            self._claims.release(alloc)
            raise
        return record, request

    def released(self, allocation_id: str) -> None:
        """The ledger released a partitioned allocation: its instance is reclaimed soon."""
        self.partitions.note_released(allocation_id)

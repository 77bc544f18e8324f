"""Which pending container each grant serves: the reservations, kubelet's view, the choice.

kubelet's Allocate names device ids only. :class:`Claims` holds what the node knows about the
containers those ids are for: the worker's pending claims (:mod:`agent.deviceplugin.kvpending`), the claim
each holding served (reserved: never chosen again, also after a restart, rebuilt from the kept
events by :func:`served_request`), the claim each visibility grant mirrored for, and kubelet's
last pod-resources view (which containers it lists, with the resources they already hold).
The decision itself is :func:`pending.choose`; this class only feeds it. Event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

from agent.deviceplugin import pending
from agent.deviceplugin.holdings import Holding
from bus.records import PendingContainer

__all__ = ["MAX_MIRRORED", "Claims", "served_request"]

MAX_MIRRORED: Final = 1024
"""Visibility grants remembered (they hold nothing in the ledger, so nothing releases them)."""
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

KubeletKey = tuple[str, str, str]
"""``(namespace, pod, container)``: how pod-resources names a container (it has no uid)."""


class Claims:
    def __init__(self, pending_containers: Callable[[], Sequence[PendingContainer]]) -> None:
        self.pending = pending_containers
        """The node's pending claims, as the worker last published them."""
        self.served: dict[str, PendingContainer] = {}
        """By allocation id: the claim each holding serves (reserved)."""
        self.mirrored: dict[str, PendingContainer] = {}
        """By allocation id: the visibility claim each visibility grant mirrored for (bounded)."""
        self.kubelet: dict[KubeletKey, frozenset[str]] = {}
        """kubelet's containers and the resources they hold devices of, as last asked."""

    def choose(
        self, resource: str, size: int, remaining: Mapping[str, int] | None = None
    ) -> PendingContainer | None:
        """The unreserved claim an Allocate of ``size`` devices of ``resource`` is for:
        kubelet's waiting container first, then the oldest that fits ``remaining``."""
        return pending.choose(
            self.pending(),
            resource,
            size,
            by_kubelet=self.waiting_for(resource),
            reserved={(p.pod_uid, p.container) for p in self.served.values()},
            remaining=remaining,
        )

    def identified(self, resource: str, size: int) -> PendingContainer | None:
        """The claim kubelet's view positively names (an exclusive or shared Allocate); None
        when it names none. A guess by age is not good enough here: the name decides which
        cards a sidecar is shown (:mod:`mirroring`), and the Pod kubelet admits may list no
        claim at all (only Pods with a sidecar do)."""
        waiting = self.waiting_for(resource)
        found = self.choose(resource, size) if waiting else None
        return found if found is not None and (found.pod_uid, found.container) in waiting else None

    def waiting_for(self, resource: str) -> set[pending.ContainerKey]:
        """The pending containers kubelet lists without a device of ``resource`` yet: kubelet
        is allocating for one of them (§3.5 step 3, "identify by kubelet")."""
        return {
            (p.pod_uid, p.container)
            for p in self.pending()
            if resource not in self.kubelet.get((p.namespace, p.pod, p.container), {resource})
        }

    def mirrored_claim(
        self, allocation_id: str, resource: str, size: int
    ) -> PendingContainer | None:
        """The visibility claim a grant is for: the one it mirrored for before (a retry), else
        the oldest not mirrored yet."""
        return self.mirrored.get(allocation_id) or pending.choose(
            self.pending(),
            resource,
            size,
            by_kubelet=self.waiting_for(resource),
            reserved={(c.pod_uid, c.container) for c in self.mirrored.values()},
        )

    def note_mirrored(self, allocation_id: str, claim: PendingContainer) -> None:
        self.mirrored.pop(allocation_id, None)
        self.mirrored[allocation_id] = claim
        while len(self.mirrored) > MAX_MIRRORED:
            self.mirrored.pop(next(iter(self.mirrored)))

    def note_kubelet(self, containers: Mapping[KubeletKey, frozenset[str]]) -> None:
        self.kubelet = dict(containers)

    def restore(self, holding: Holding) -> None:
        """A kept holding (restored after a restart) stays reserved for the claim it served."""
        request = served_request(holding)
        if request is not None:
            self.served[holding.allocation_id] = request


def served_request(holding: Holding) -> PendingContainer | None:
    """The pending container a kept holding served, as far as its event recorded it: enough to
    reserve it (never chosen again) and to answer a kubelet retry with its caps."""
    if holding.mode == "visibility" or not holding.pod_uid or holding.container is None:
        return None
    return PendingContainer(
        pod_uid=holding.pod_uid,
        namespace=holding.pod_namespace or "",
        pod=holding.pod_name or "",
        container=holding.container,
        resource=holding.resource,
        count=len(holding.device_ids),
        units=max((u for _, u in holding.charges), default=0),
        memory_mib=holding.memory_mib,
        cores_percentage=holding.cores_percentage,
        profile=holding.profile,
        created_at=_EPOCH,
    )

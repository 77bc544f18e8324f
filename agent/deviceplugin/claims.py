"""Which pending container each grant serves: the reservations, kubelet's view, the choice.

kubelet's Allocate names device ids only. :class:`Claims` holds what the node knows about the
containers those ids are for: the worker's pending claims (:mod:`agent.deviceplugin.kvpending`), the claim
each holding served (reserved: never chosen again, also after a restart, rebuilt from the kept
events by :func:`served_request`), the claim each visibility grant mirrored for, and kubelet's
last pod-resources view (which containers it lists, with the resources they already hold).
The decision itself is :func:`pending.choose`; this class only feeds it. Event-loop thread only.

Its tables change only through its methods (:meth:`Claims.reserve`, :meth:`~Claims.release`,
:meth:`~Claims.note_mirrored`, :meth:`~Claims.note_kubelet`, :meth:`~Claims.restore`), and each
change wakes :meth:`Claims.wait_for`, as does a new pending list from a source that announces
its changes (:class:`Announcing`, e.g. :class:`agent.deviceplugin.kvpending.PendingView`): an Allocate waiting
for its claim wakes when something it depends on changed, never on a timer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final, Protocol, runtime_checkable

import anyio

from agent.deviceplugin import pending
from agent.deviceplugin.holdings import Holding
from bus.records import PendingContainer

__all__ = ["MAX_MIRRORED", "Announcing", "Claims", "PendingSource", "served_request"]

MAX_MIRRORED: Final = 1024
"""Visibility grants remembered (they hold nothing in the ledger, so nothing releases them)."""
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

KubeletKey = tuple[str, str, str]
"""``(namespace, pod, container)``: how pod-resources names a container (it has no uid)."""


PendingSource = Callable[[], Sequence[PendingContainer]]
"""The node's pending claims, as the worker last published them."""


@runtime_checkable
class Announcing(Protocol):
    """A pending source that says when its list changes."""

    def __call__(self) -> Sequence[PendingContainer]: ...

    def next_change(self) -> anyio.Event:
        """An event set at the next change of the list (a fresh one after each change)."""
        ...


class Claims:
    def __init__(self, pending_containers: PendingSource) -> None:
        self.pending = pending_containers
        """The node's pending claims, as the worker last published them."""
        self._served: dict[str, PendingContainer] = {}
        """By allocation id: the claim each holding serves (reserved)."""
        self._mirrored: dict[str, PendingContainer] = {}
        """By allocation id: the visibility claim each visibility grant mirrored for (bounded)."""
        self._kubelet: dict[KubeletKey, frozenset[str]] = {}
        """kubelet's containers and the resources they hold devices of, as last asked."""
        self._changed = anyio.Event()
        """Set (and replaced) at every change of the tables above."""

    def _note_change(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def reserved(self, allocation_id: str) -> PendingContainer | None:
        """The claim the holding ``allocation_id`` serves (None: none reserved for it)."""
        return self._served.get(allocation_id)

    def reserve(self, allocation_id: str, claim: PendingContainer) -> None:
        """``claim`` is served by ``allocation_id``: never chosen for another grant."""
        self._served[allocation_id] = claim
        self._note_change()

    def release(self, allocation_id: str) -> None:
        """The holding ``allocation_id`` ended (or never came to be): its claim is free."""
        if self._served.pop(allocation_id, None) is not None:
            self._note_change()

    async def wait_for(self, resource: str, size: int, timeout_s: float) -> PendingContainer | None:
        """:meth:`choose`, waiting up to ``timeout_s`` for a claim to appear: woken by each change
        of these tables and of an :class:`Announcing` source (a plain source is read again only
        when the tables change, and once more at the deadline). Cancelling it changes nothing.
        """
        with anyio.move_on_after(timeout_s):
            while (found := self.choose(resource, size)) is None:
                await self._next_change()
            return found
        return self.choose(resource, size)

    async def _next_change(self) -> None:
        """Return at the next change of the tables or of the announcing source."""
        source = self.pending
        if not isinstance(source, Announcing):
            await self._changed.wait()
            return
        async with anyio.create_task_group() as tg:
            for event in (self._changed, source.next_change()):
                tg.start_soon(_set_then_cancel, event, tg.cancel_scope)

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
            reserved={(p.pod_uid, p.container) for p in self._served.values()},
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
            if resource not in self._kubelet.get((p.namespace, p.pod, p.container), {resource})
        }

    def mirrored_claim(
        self, allocation_id: str, resource: str, size: int
    ) -> PendingContainer | None:
        """The visibility claim a grant is for: the one it mirrored for before (a retry), else
        the oldest not mirrored yet."""
        return self._mirrored.get(allocation_id) or pending.choose(
            self.pending(),
            resource,
            size,
            by_kubelet=self.waiting_for(resource),
            reserved={(c.pod_uid, c.container) for c in self._mirrored.values()},
        )

    def note_mirrored(self, allocation_id: str, claim: PendingContainer) -> None:
        self._mirrored.pop(allocation_id, None)
        self._mirrored[allocation_id] = claim
        while len(self._mirrored) > MAX_MIRRORED:
            self._mirrored.pop(next(iter(self._mirrored)))
        self._note_change()

    def note_kubelet(self, containers: Mapping[KubeletKey, frozenset[str]]) -> None:
        self._kubelet = dict(containers)
        self._note_change()

    def restore(self, holding: Holding) -> None:
        """A kept holding (restored after a restart) stays reserved for the claim it served."""
        request = served_request(holding)
        if request is not None:
            self.reserve(holding.allocation_id, request)


async def _set_then_cancel(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


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

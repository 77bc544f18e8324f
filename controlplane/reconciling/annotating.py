"""The allocation written back to its Pod: the ``device.gpustack.ai/accelerator.allocated`` annotation.

The device agent holds no Kubernetes access, so it cannot say on the Pod what it got; its
allocation event does (pod uid, namespace, name and container, once it knew them: from the
pending record it matched at Allocate, or later from kubelet's pod-resources). The worker turns
that event into the Pod annotation, so ``kubectl get pod -o yaml`` shows the card.

The value is the reference's shape: a JSON map keyed by container name, each entry
``{"devices": {"groups": [{"id", "manufacturer", "accelerators": [...]}]}, "deviceIDs": [...]}``,
an accelerator being ``{"id", "index", "mode", "allocated"}`` (``mode`` the numeric
DeviceAllocationMode: 1 Exclusive, 2 Shared, 3 Sliced, 4 Partitioned; ``allocated`` the units
it holds on that card) plus, for a slice, the caps injected (``memoryMib``,
``coresPercentage``) and, for a partition, ``allocatedPhysicalProfile`` and
``allocatedPhysicalID``. :func:`entry` and :func:`merged` are the pure decisions;
:class:`PodAnnotator` writes, as leader only.

An allocation whose node's cards are not known yet (its devices event still to come) is
retried like a failed write, up to :data:`MAX_TRIES`.

Invariants: a write only ever sets the entry of the container the event names, keeping the
others'; it is conditional on the Pod's ``resourceVersion`` (a 409 re-reads); a Pod whose uid is
not the event's is a different Pod of the same name and is left alone; nothing is written when
the entry is already there (a restarted worker re-reading the retained events writes nothing).
A released allocation leaves the annotation as it was: it records what the container got.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Final

import anyio

from bus import events
from bus.devices import DeviceGroup
from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.reconciling.allocating import mode_of, units_by_card
from controlplane.reconciling.nodestates import Ledger
from controlplane.resources import PODS, Ref

__all__ = ["ANNOTATION", "PodAnnotator", "entry", "merged"]

log = logging.getLogger(__name__)

ANNOTATION: Final = "device.gpustack.ai/accelerator.allocated"
MODE_NUMBERS: Final = {"Exclusive": 1, "Shared": 2, "Sliced": 3, "Partitioned": 4}
"""The reference's DeviceAllocationMode numbers (0 None and 5 Visibility are never written)."""
MAX_CONFLICTS: Final = 5
MAX_TRIES: Final = 10
"""Failed writes of one entry before it is given up (a Pod that refuses the patch for good);
the allocation's next event brings it back."""


def named(event: events.Event) -> events.AllocationEvent | None:
    """``event`` when it is an allocation that names the Pod and container it serves."""
    if not isinstance(event, events.AllocationEvent) or event.action != "allocated":
        return None
    if not (event.pod_namespace and event.pod_name and event.container):
        return None
    return event if mode_of(event) is not None else None


def entry(event: events.AllocationEvent, groups: Iterable[DeviceGroup]) -> dict[str, Any] | None:
    """The annotation entry of the container ``event`` serves; None: it names no known card."""
    mode = mode_of(event)
    if mode is None:
        return None
    groups = tuple(groups)
    accelerators = {a.id: a for g in groups for a in g.accelerators}
    units, _ = units_by_card(accelerators, event)
    found = []
    for group in groups:
        held = [_accelerator(a.id, a.index, mode, units[a.id], event)
                for a in group.accelerators if a.id in units]  # fmt: skip
        if held:
            found.append({"id": group.id, "manufacturer": group.manufacturer, "accelerators": held})
    if not found:
        return None
    return {"devices": {"groups": found}, "deviceIDs": sorted(event.device_ids)}


def _accelerator(
    card_id: str, index: int, mode: str, units: int, event: events.AllocationEvent
) -> dict[str, Any]:
    out: dict[str, Any] = {"id": card_id, "index": index, "mode": MODE_NUMBERS[mode]}
    out["allocated"] = units
    if event.memory_mib is not None:
        out["memoryMib"] = event.memory_mib
    if event.cores_percentage is not None:
        out["coresPercentage"] = event.cores_percentage
    if event.profile is not None:
        out["allocatedPhysicalProfile"] = event.profile
    if event.partition_id is not None:
        out["allocatedPhysicalID"] = event.partition_id
    return out


def merged(current: str | None, container: str, value: dict[str, Any]) -> str | None:
    """The annotation with ``container``'s entry set to ``value``; None when it already is.

    An unreadable current value (not a JSON object) is replaced: it could only mislead.
    """
    try:
        existing = json.loads(current) if current else {}
    except ValueError:
        existing = {}
    if not isinstance(existing, dict):
        existing = {}
    if existing.get(container) == value:
        return None
    existing[container] = value
    return json.dumps(existing, sort_keys=True, separators=(",", ":"))


class NotYet(Exception):
    """An entry cannot be built yet: retried like a failed write."""


class PodAnnotator:
    """Writes each named allocation's entry onto its Pod.

    :meth:`note` runs for every event in every replica (never blocks, bounded: the oldest
    unwritten entry is dropped first, and the next event of that allocation brings it back);
    :meth:`run` writes, in the leader only.
    """

    def __init__(self, ledger: Ledger, *, max_pending: int = 4096, retry_s: float = 1.0) -> None:
        self._ledger = ledger
        self._pending: OrderedDict[tuple[str, str], events.AllocationEvent] = OrderedDict()
        self._max = max_pending
        self._retry_s = retry_s
        self._wake = anyio.Event()
        self._failures: dict[tuple[str, str], int] = {}
        self.written = 0
        """Annotations patched so far (tests, metrics)."""

    def note(self, event: events.Event) -> None:
        found = named(event)
        if found is None:
            return
        key = (found.node, found.allocation_id)
        self._pending.pop(key, None)
        self._pending[key] = found
        while len(self._pending) > self._max:
            self._pending.popitem(last=False)
        self._wake.set()

    async def run(self, api: KubeClient) -> None:
        """Write what was noted, until cancelled; a failed write is retried after ``retry_s``."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._pending:
                key, event = self._pending.popitem(last=False)
                try:
                    await self.write(api, event)
                except (errors.ApiError, NotYet) as e:
                    tries = self._failures[key] = self._failures.get(key, 0) + 1
                    where = f"{event.pod_namespace}/{event.pod_name}"
                    if tries >= MAX_TRIES:
                        log.warning("annotating %s: %s; given up after %d tries", where, e, tries)
                    else:
                        log.warning("annotating %s: %s; again", where, e)
                        self._pending.setdefault(key, event)
                        await anyio.sleep(self._retry_s)
                        continue
                self._failures.pop(key, None)

    async def write(self, api: KubeClient, event: events.AllocationEvent) -> bool:
        """Patch one Pod's annotation; False when there was nothing to write.

        :raises errors.ApiError: the API failed (other than the Pod being gone).
        :raises NotYet: the node's cards are not known yet (its devices event follows).
        """
        state = self._ledger.get(event.node)
        if state is None or state.groups is None:  # its devices event has not arrived yet
            raise NotYet(f"the cards of node {event.node} are not known yet")
        value = entry(event, state.groups)
        if value is None or event.container is None:
            return False
        ref = Ref(resource=PODS, name=event.pod_name or "", namespace=event.pod_namespace)
        for _ in range(MAX_CONFLICTS):
            try:
                pod = await api.get(ref)
                meta = pod.get("metadata") or {}
                if event.pod_uid and meta.get("uid") != event.pod_uid:
                    return False  # another Pod of the same name: not ours to annotate
                text = merged((meta.get("annotations") or {}).get(ANNOTATION), event.container,
                              value)  # fmt: skip
                if text is None:
                    return False
                body = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                                     "annotations": {ANNOTATION: text}}}  # fmt: skip
                await api.patch(ref, body)
                self.written += 1
                return True
            except errors.NotFound:
                return False
            except errors.Conflict:
                continue
        raise errors.Conflict(409, f"{ref} kept changing")

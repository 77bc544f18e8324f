"""The per-card units ledger: who holds what share of which card, and in which mode.

One card is :data:`resources.UNITS_PER_CARD` units. A holding is one container's allocation of
one resource: its device ids and the units it charges per card. Invariants:

- a card is held in at most one mode at a time (visibility is never charged, so never holds);
- the units charged on a card never exceed a whole card;
- kubelet never gives one device id of a resource to two live containers, so a new Allocate that
  names a device id we still count as held proves that older holding is gone: it is released
  first (this keeps the ledger right even without the pod-resources API);
- the ledger never changes without the change being returned, so every change is published.

The allocation id is ``<resource>/<smallest device id>``: Allocate carries no pod identity, and
that pair is unique among live containers. Pod and container names are filled in later from the
pod-resources API (a second ``allocated`` event under the same id).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from agent.deviceplugin import errors
from agent.deviceplugin.resources import UNITS_PER_CARD, Mode
from bus import events


@dataclass(frozen=True)
class Holding:
    allocation_id: str
    resource: str
    mode: Mode
    device_ids: tuple[str, ...]
    charges: tuple[tuple[str, int], ...]
    """(card id, units) per card this allocation touches."""
    since: float
    """Monotonic seconds when it was charged (or restored)."""
    pod_namespace: str | None = None
    pod_name: str | None = None
    container: str | None = None
    pod_uid: str | None = None
    """Known when a pending record named the container at Allocate (sliced, partitioned)."""
    memory_mib: int | None = None
    """Sliced: the memory cap injected on each card."""
    cores_percentage: int | None = None
    """Sliced: the SM/CU cap injected."""
    profile: str | None = None
    """Partitioned: the instance's profile name."""
    partition_id: str | None = None
    """Partitioned: the instance's UUID."""


@dataclass(frozen=True)
class Change:
    action: Literal["allocated", "released"]
    holding: Holding

    def event(self, node: str) -> events.AllocationEvent:
        h = self.holding
        return events.AllocationEvent(
            node=node,
            allocation_id=h.allocation_id,
            action=self.action,
            resource=h.resource,
            device_ids=h.device_ids,
            pod_namespace=h.pod_namespace,
            pod_name=h.pod_name,
            container=h.container,
            pod_uid=h.pod_uid,
            charges=tuple(events.CardCharge(accelerator_id=c, units=u) for c, u in h.charges),
            memory_mib=h.memory_mib,
            cores_percentage=h.cores_percentage,
            profile=h.profile,
            partition_id=h.partition_id,
        )


@dataclass(frozen=True)
class LiveContainer:
    """One container's devices of one resource, as kubelet's pod-resources API lists them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


Resolver = Callable[[str, Sequence[str]], "tuple[Mode, tuple[tuple[str, int], ...]] | None"]
"""Maps (resource, device ids) to (mode, charges), or None when they name no token we serve."""


def allocation_id(resource: str, device_ids: Iterable[str]) -> str:
    return f"{resource}/{min(device_ids)}"


class Ledger:
    """The holdings of one node. Not thread-safe: only the event loop thread touches it."""

    def __init__(self) -> None:
        self._holdings: dict[str, Holding] = {}
        # Indexes kept in step with _holdings (only _put and _release touch them), so that an
        # Allocate costs the same with 1,000 holdings as with one.
        self._by_device: dict[tuple[str, str], str] = {}
        self._by_card: dict[str, dict[str, Holding]] = {}

    def copy(self) -> Ledger:
        """A snapshot that later changes do not affect (for metrics and status)."""
        return copy.deepcopy(self)

    def holdings(self) -> tuple[Holding, ...]:
        return tuple(sorted(self._holdings.values(), key=lambda h: h.allocation_id))

    def used(self, card: str) -> int:
        return sum(
            u for h in self._by_card.get(card, {}).values() for c, u in h.charges if c == card
        )

    def remaining(self, card: str) -> int:
        return UNITS_PER_CARD - self.used(card)

    def mode_of(self, card: str) -> Mode | None:
        for h in self._by_card.get(card, {}).values():
            if any(c == card and u > 0 for c, u in h.charges):
                return h.mode
        return None

    def held_modes(self) -> dict[str, Mode]:
        """The mode each charged card is held in. Runs on every Allocate, so it walks cards,
        not holdings; where restored holdings disagree on a card, the last recorded decides."""
        modes: dict[str, Mode] = {}
        for card, holders in self._by_card.items():
            for h in reversed(holders.values()):
                if any(c == card and u > 0 for c, u in h.charges):
                    modes[card] = h.mode
                    break
        return modes

    def holder(self, resource: str, device_ids: Sequence[str]) -> Holding | None:
        """The holding with exactly these device ids of ``resource``, if any."""
        found = self._holdings.get(allocation_id(resource, device_ids)) if device_ids else None
        return found if found and set(found.device_ids) == set(device_ids) else None

    def check(
        self,
        mode: Mode,
        charges: Mapping[str, int],
        names: Mapping[str, str],
        *,
        ignoring: Collection[str] = (),
    ) -> None:
        """Refuse ``charges`` in ``mode`` if a card is held in another mode or would overflow.

        ``ignoring`` names holdings to leave out (the stale ones a new request replaces).

        :raises errors.Conflict: a card is held in another mode; names the card and both modes.
        :raises errors.Exhausted: a card has fewer free units than asked.
        """
        for card, units in charges.items():
            others = [h for k, h in self._by_card.get(card, {}).items() if k not in ignoring]
            held = {h.mode for h in others for c, u in h.charges if c == card and u > 0}
            if held and mode not in held and units > 0:
                raise errors.Conflict(
                    f"card {names.get(card, card)} is held in {min(held)} mode, "
                    f"cannot allocate it in {mode} mode"
                )
            used = sum(u for h in others for c, u in h.charges if c == card)
            if used + units > UNITS_PER_CARD:
                raise errors.Exhausted(
                    f"card {names.get(card, card)} has {UNITS_PER_CARD - used} units free, "
                    f"{units} asked"
                )

    def stale(self, resource: str, device_ids: Sequence[str]) -> list[Holding]:
        """Holdings of ``resource`` sharing a device id with a new request (so they are gone)."""
        keys = {self._by_device.get((resource, d)) for d in device_ids} - {None}
        return [self._holdings[k] for k in sorted(k for k in keys if k is not None)]

    def charge(self, holding: Holding) -> list[Change]:
        """Record ``holding``, releasing holdings it proves stale. The caller checked it."""
        changes = [self._release(h) for h in self.stale(holding.resource, holding.device_ids)]
        self._put(holding)
        return [*changes, Change("allocated", holding)]

    def _put(self, holding: Holding) -> None:
        self._holdings[holding.allocation_id] = holding
        for device in holding.device_ids:
            self._by_device[(holding.resource, device)] = holding.allocation_id
        for card, _ in holding.charges:
            self._by_card.setdefault(card, {})[holding.allocation_id] = holding

    def release(self, allocation: str) -> list[Change]:
        held = self._holdings.get(allocation)
        return [self._release(held)] if held else []

    def _release(self, holding: Holding) -> Change:
        del self._holdings[holding.allocation_id]
        for device in holding.device_ids:
            self._by_device.pop((holding.resource, device), None)
        for card, _ in holding.charges:
            per_card = self._by_card.get(card, {})
            per_card.pop(holding.allocation_id, None)
            if not per_card:
                self._by_card.pop(card, None)
        return Change("released", holding)

    def restore(
        self, retained: Iterable[events.AllocationEvent], resolve: Resolver, *, now: float
    ) -> list[Change]:
        """Re-charge the allocations the bus still holds as ``allocated`` after a restart.

        Device ids that name no token we serve any more are skipped; nothing is refused for a
        mode conflict, because these allocations exist whether or not we like them.
        """
        changes: list[Change] = []
        for event in retained:
            resolved = resolve(event.resource, event.device_ids) if event.device_ids else None
            if event.action != "allocated" or resolved is None:
                continue
            changes.extend(self.charge(restored(event, resolved, now=now)))
        return changes

    def reconcile(
        self,
        live: Sequence[LiveContainer],
        resolve: Resolver,
        *,
        now: float,
        grace_s: float,
    ) -> list[Change]:
        """Make the ledger agree with what kubelet says live containers hold.

        A live allocation we lack is charged; one we have gains its pod and container names; a
        holding no live container accounts for is released once older than ``grace_s``.
        """
        changes: list[Change] = []
        seen: set[str] = set()
        for entry in live:
            resolved = resolve(entry.resource, entry.device_ids) if entry.device_ids else None
            if resolved is None:
                continue
            key = allocation_id(entry.resource, entry.device_ids)
            seen.add(key)
            changes.extend(self._adopt(entry, key, resolved, now))
        gone = [
            h
            for h in self._holdings.values()
            if h.allocation_id not in seen and now - h.since >= grace_s
        ]
        return changes + [self._release(h) for h in gone]

    def _adopt(
        self,
        entry: LiveContainer,
        key: str,
        resolved: tuple[Mode, tuple[tuple[str, int], ...]],
        now: float,
    ) -> list[Change]:
        names = (entry.namespace, entry.pod, entry.container)
        current = self.holder(entry.resource, entry.device_ids)
        if current is not None:
            if (current.pod_namespace, current.pod_name, current.container) == names:
                return []
            updated = replace(
                current, pod_namespace=names[0], pod_name=names[1], container=names[2]
            )
            self._put(updated)
            return [Change("allocated", updated)]
        mode, charges = resolved
        holding = Holding(
            allocation_id=key,
            resource=entry.resource,
            mode=mode,
            device_ids=tuple(sorted(entry.device_ids)),
            charges=charges,
            since=now,
            pod_namespace=names[0],
            pod_name=names[1],
            container=names[2],
        )
        return self.charge(holding)


def restored(
    event: events.AllocationEvent,
    resolved: tuple[Mode, tuple[tuple[str, int], ...]],
    *,
    now: float,
) -> Holding:
    """The holding a kept ``allocated`` event stands for.

    Its own charges win over the resolved token share when they name the same cards: a sliced
    container was charged its own units, which its tokens do not say. An event from an agent
    that predates the field (no charges) falls back to the token share.
    """
    mode, charges = resolved
    kept = tuple((c.accelerator_id, min(c.units, UNITS_PER_CARD)) for c in event.charges)
    if kept and {c for c, _ in kept} == {c for c, _ in charges}:
        charges = kept
    return Holding(
        allocation_id=allocation_id(event.resource, event.device_ids),
        resource=event.resource,
        mode=mode,
        device_ids=tuple(sorted(event.device_ids)),
        charges=charges,
        since=now,
        pod_namespace=event.pod_namespace,
        pod_name=event.pod_name,
        container=event.container,
        pod_uid=event.pod_uid,
        memory_mib=event.memory_mib,
        cores_percentage=event.cores_percentage,
        profile=event.profile,
        partition_id=event.partition_id,
    )


def live_allocations(history: Iterable[events.AllocationEvent]) -> list[events.AllocationEvent]:
    """What a history of ledger changes leaves in force (pure).

    The latest event per allocation id wins (by timestamp, then by order); an allocation whose
    latest event is ``released`` is gone. Used to rebuild the ledger from the bus's retained
    allocation history after a restart.
    """
    latest: dict[str, events.AllocationEvent] = {}
    for event in history:
        known = latest.get(event.allocation_id)
        if known is None or event.ts >= known.ts:
            latest[event.allocation_id] = event
    return [e for e in latest.values() if e.action == "allocated"]

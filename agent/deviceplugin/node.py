"""The node's device-plugin state: cards, servers' token lists, the ledger, and the servicers.

Synchronous and owned by the event loop thread: every method runs to completion without an
``await``, so two Allocate calls on different servers can never interleave halfway (this is the
node-wide mutex of other plugins, for free). Every ledger change is published, then the token
lists are recomputed, because holding a card in one mode makes its tokens of the other modes
Unhealthy. Allocate is the hot path, so recomputing is cheap where nothing changed: it stops at
once unless the cards or a card's mode changed (the first holding of a card, the last release),
re-plans from cached per-card tokens, and re-keys and re-sends only the lists that changed.

The node also owns the host side of an injection: the per-allocation work directories a sliced
container mounts, and the small files a slicing runtime reads there, are created before Allocate
answers and removed when the allocation is released (a ``mkdir``, a short write and an
``rmtree`` of a near-empty directory: cheap enough for the loop). A driver step the injection
needs (:class:`injection.DriverStep`) is performed through the control registered for its kind
before the grant is charged; with none registered the grant is refused, naming the step, so a
container never starts without the isolation its mode promises.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence

from agent.deviceplugin import (
    allocation,
    errors,
    ledger,
    partitioning,
    pending,
    resources,
    responders,
)
from agent.deviceplugin.injection import DriverStep, HostFile, Injection
from agent.deviceplugin.partitioning import Partitions
from agent.deviceplugin.server import Key, ResourceServicer
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices, events
from bus.records import PendingContainer

log = logging.getLogger(__name__)

_Index = tuple[tuple[resources.Token, ...], dict[str, resources.Token]]
"""A server's token list and its tokens by id."""

DriverControl = Callable[[DriverStep], None]
"""Performs one driver step (idempotent: a retried Allocate asks again); raises
:class:`errors.ActuationFailed` when the driver refuses."""


class Node:
    def __init__(
        self,
        settings: DevicePluginSettings,
        *,
        publish: Callable[[events.Event], None],
        initial_allocations: Sequence[events.AllocationEvent] = (),
        clock: Callable[[], float] = time.monotonic,
        partitions: Partitions | None = None,
        pending_containers: Callable[[], Sequence[PendingContainer]] = tuple,
        controls: Mapping[str, DriverControl] | None = None,
    ) -> None:
        self._settings = settings
        self._controls = dict(controls or {})
        """Driver-step kind to the control that performs it."""
        self._pending = pending_containers
        """The node's pending sliced/partitioned containers, as the worker last published them."""
        self._served: dict[str, PendingContainer] = {}
        """By allocation id: the pending container each sliced holding serves (reserved)."""
        self._publish = publish
        self._clock = clock
        self.partitions = partitions
        """Creates and reclaims MIG instances; None: partitioned grants name ``<GPU>:<MIG>``
        indexes of instances made by someone else (no actuation)."""
        self._retained: Sequence[events.AllocationEvent] | None = tuple(initial_allocations)
        self._cards: dict[str, resources.Card] = {}
        self._views: dict[str, allocation.View] = {}
        self._indexes: dict[str, _Index] = {}
        self._planned_for: tuple[dict[str, resources.Card], dict[str, resources.Mode]] | None = None
        self.ledger = ledger.Ledger()
        self.servicers: dict[Key, ResourceServicer] = {}
        self.on_allocate: Callable[[], None] = _nothing
        """Called after every Allocate that went through (the pod-resources task listens)."""
        self.updated = False
        """False until the first :meth:`update`: nothing is served before detection has run."""

    def update(self, groups: Sequence[devices.DeviceGroup]) -> None:
        """Adopt a detection pass: cards, health, servers. Held cards never lose their tokens."""
        fresh = resources.cards_of(groups)
        self._cards = resources.keep_held(fresh, self._cards, self.ledger.held_modes())
        self.updated = True
        self._refresh()
        if self._retained is not None:  # the first pass is when retained ids can be resolved
            retained, self._retained = self._retained, None
            self._apply(self.ledger.restore(retained, self._resolve, now=self._clock()))

    def _refresh(self) -> None:
        held = self.ledger.held_modes()
        if (self._cards, held) == self._planned_for:
            return  # same cards, same modes: every token list would come out the same
        self._planned_for = (dict(self._cards), held)
        specs = resources.plan_servers(
            self._cards,
            held_modes=held,
            no_shared=self._settings.no_shared,
            no_sliced=self._settings.no_sliced,
            no_partitioned=self._settings.no_partitioned,
        )
        for key in [k for k in self.servicers if k not in specs]:
            del self.servicers[key]
        for key, spec in specs.items():
            servicer = self.servicers.get(key)
            if servicer is None:
                self.servicers[key] = ResourceServicer(spec, self)
            elif servicer.offer(spec):
                log.info("%s: %d devices re-announced", spec.resource, len(spec.tokens))
        self._reindex()

    def _reindex(self) -> None:
        """Rebuild the views, re-keying only the token lists that changed.

        A servicer keeps its spec object while its tokens stay equal, so an unchanged list is
        recognised by identity and its id index (thousands of tokens for visibility) is reused.
        """
        indexes: dict[str, _Index] = {}
        views: dict[str, allocation.View] = {}
        for servicer in self.servicers.values():
            spec = servicer.spec
            index = self._indexes.get(spec.resource)
            if index is None or index[0] is not spec.tokens:
                index = (spec.tokens, {t.id: t for t in spec.tokens})
            indexes[spec.resource] = index
            views[spec.resource] = allocation.View(
                mode=spec.mode, resource=spec.resource, tokens=index[1], cards=self._cards
            )
        self._indexes, self._views = indexes, views

    def _resolve(
        self, resource: str, device_ids: Sequence[str]
    ) -> tuple[resources.Mode, tuple[tuple[str, int], ...]] | None:
        """(mode, charges) of an allocation; a partitioned one is charged on the card its
        recorded instance lives on, not on its tokens' cards."""
        record = self._record(resource, device_ids)
        view = self._views.get(resource)
        card = self._cards.get(record.card_id) if record is not None else None
        if view is not None and card is not None:
            holding = allocation.partition_holding(view, device_ids, card, now=0.0)
            return view.mode, holding.charges
        return allocation.resolve(self._views, resource, device_ids)

    def _record(self, resource: str, device_ids: Sequence[str]) -> partitioning.Record | None:
        if self.partitions is None or not device_ids:
            return None
        record = self.partitions.records.get(ledger.allocation_id(resource, device_ids))
        return record if record and set(record.device_ids) == set(device_ids) else None

    def _apply(self, changes: Sequence[ledger.Change]) -> None:
        for change in changes:
            self._publish(change.event(self._settings.node_name))
            if change.action == "released":
                self._served.pop(change.holding.allocation_id, None)
                self._remove_work_dir(change.holding.allocation_id)
                if self.partitions is not None and change.holding.mode == "partitioned":
                    self.partitions.note_released(change.holding.allocation_id)
        if changes:
            self._refresh()

    def _view(self, key: Key) -> allocation.View:
        return self._views[resources.resource_name(*key)]

    def allocate(self, key: Key, device_ids: Sequence[str]) -> Injection:
        """Decide, build the injection, prepare its host directories, then charge: a refused
        request changes nothing in the ledger."""
        view = self._view(key)
        request = self._request(view, device_ids)
        grant = allocation.decide(view, device_ids, self.ledger, now=self._clock(), request=request)
        injection = responders.respond(
            grant,
            host_lib_dir=self._settings.host_lib_dir,
            host_work_dir=self._settings.host_work_dir,
        )
        _make_dirs(injection.host_dirs)
        _write_files(injection.files)
        self._perform(injection.steps)
        if (
            grant.holding is not None
            and self.ledger.holder(grant.holding.resource, grant.holding.device_ids) is None
        ):
            if grant.request is not None:
                self._served[grant.holding.allocation_id] = grant.request
            self._apply(self.ledger.charge(grant.holding))
        self.on_allocate()
        return injection

    def _request(self, view: allocation.View, device_ids: Sequence[str]) -> PendingContainer | None:
        """The pending container a sliced Allocate serves (the one it served, on a retry);
        None: no pending record for it, and the grant is today's token share.

        kubelet's pod-resources does not list a container before its Allocate answers, so the
        choice is the oldest feasible pending one (:func:`pending.choose`).
        """
        if view.mode != "sliced":
            return None
        served = self._served.get(ledger.allocation_id(view.resource, device_ids))
        if served is not None:
            return served
        cards = {view.tokens[d].card for d in device_ids if d in view.tokens}
        return pending.choose(
            self._pending(),
            view.resource,
            len(device_ids),
            reserved={(p.pod_uid, p.container) for p in self._served.values()},
            remaining={c: self.ledger.remaining(c) for c in cards},
        )

    async def allocate_partitioned(self, key: Key, device_ids: Sequence[str]) -> Injection:
        """Give the container its own MIG instance: reuse the one recorded for this allocation
        (a kubelet retry, or an allocation adopted after a restart), else create one. The ledger
        is charged only once the instance and its record exist, so a failure changes nothing.
        """
        if self.partitions is None or key[0] != "nvidia":  # MIG control is NVML's
            return self.allocate(key, device_ids)
        view = self._view(key)
        allocation.partition_request(view, device_ids)
        record = self._record(view.resource, device_ids)
        if record is None:
            alloc = ledger.allocation_id(view.resource, device_ids)
            if self.partitions.pending(alloc):
                raise errors.Conflict(f"the instance of {alloc} is being created; retry")
            cards = [
                c
                for c in self._cards.values()
                if c.manufacturer == key[0] and c.partition_count > 0
            ]
            record = await self.partitions.create(alloc, view.resource, device_ids, cards)
        card = self._cards.get(record.card_id)
        if card is not None and self.ledger.holder(view.resource, device_ids) is None:
            holding = allocation.partition_holding(view, device_ids, card, now=self._clock())
            self._apply(self.ledger.charge(holding))
        self.on_allocate()
        return Injection(envs={"NVIDIA_VISIBLE_DEVICES": record.mig_uuid})

    def _perform(self, steps: Sequence[DriverStep]) -> None:
        """Every step through its control, in order.

        :raises errors.CannotInject: no control performs a step's kind.
        """
        for step in steps:
            control = self._controls.get(step.kind)
            if control is None:
                raise errors.CannotInject(
                    f"the grant needs {step.describe()}, which this device plugin has no "
                    "driver control for"
                )
            control(step)

    def held_partitions(self) -> set[str]:
        return {h.allocation_id for h in self.ledger.holdings() if h.mode == "partitioned"}

    def partitioned_cards(self) -> list[str]:
        return [c.id for c in self._cards.values() if c.partition_count > 0]

    def _remove_work_dir(self, allocation_id: str) -> None:
        path = responders.work_dir(self._settings.host_work_dir, allocation_id)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            if os.path.exists(path):
                log.warning("cannot remove the work directory %s of %s", path, allocation_id)

    def prefer(
        self, key: Key, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        return allocation.prefer(
            self._view(key),
            self.ledger,
            available=available,
            must_include=must_include,
            size=size,
        )

    def reconcile(self, live: Sequence[ledger.LiveContainer]) -> None:
        """Agree with kubelet's pod-resources list (names, missed and finished allocations)."""
        ours = [c for c in live if c.resource in self._views]
        grace = self._settings.release_grace_s
        self._apply(self.ledger.reconcile(ours, self._resolve, now=self._clock(), grace_s=grace))


def _nothing() -> None:
    pass


def _write_files(files: Sequence[HostFile]) -> None:
    """Write each file (world-readable: the container may not run as root).

    :raises errors.CannotInject: naming the file that could not be written.
    """
    for file in files:
        try:
            with open(file.path, "w", encoding="utf-8") as f:
                f.write(file.content)
            os.chmod(file.path, 0o644)
        except OSError as e:
            raise errors.CannotInject(f"cannot write {file.path}: {e}") from e


def _make_dirs(paths: Sequence[str]) -> None:
    """Create each directory, writable by any user (the container may not run as root).

    :raises errors.CannotInject: naming the directory that could not be made.
    """
    for path in paths:
        try:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o777)  # private to one container, whatever user it runs as
        except OSError as e:
            raise errors.CannotInject(f"cannot create the work directory {path}: {e}") from e

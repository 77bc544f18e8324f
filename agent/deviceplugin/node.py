"""The node's device-plugin state: cards, servers' token lists, the ledger, and the servicers.

Synchronous and owned by the event loop thread: every method runs to completion without an
``await``, so two Allocate calls on different servers can never interleave halfway (this is the
node-wide mutex of other plugins, for free). Every ledger change is published, then the token
lists are recomputed, because holding a card in one mode makes its tokens of the other modes
Unhealthy. Allocate is the hot path, so recomputing is cheap where nothing changed: it stops at
once unless the cards or a card's mode changed (the first holding of a card, the last release),
re-plans from cached per-card tokens, and re-keys and re-sends only the lists that changed.

The node also drives the host side of an injection (:mod:`workdirs`): the per-allocation work
directories a sliced container mounts, and the small files a slicing runtime reads there, are
created before Allocate answers and removed when the allocation is released, or at once when its
Allocate is refused. Which pending container a grant serves is :class:`Claims`' table, changed
only through its ``reserve``/``release``. A partitioned Allocate's MIG instance, and the wait for
its claim, are :mod:`instances`' (the node only charges the holding once it exists). A driver step the injection
needs (:class:`injection.DriverStep`) is performed through the control registered for its kind
before the grant is charged; with none registered the grant is refused, naming the step, so a
container never starts without the isolation its mode promises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from agent.deviceplugin import (
    allocation,
    cdi,
    errors,
    mirroring,
    resources,
    responders,
    workdirs,
)
from agent.deviceplugin import holdings as ledger
from agent.deviceplugin.claims import Claims, KubeletKey, PendingSource
from agent.deviceplugin.injection import DriverStep, Injection
from agent.deviceplugin.instances import MIG_MANUFACTURER, Instances
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


class KubeletView(Protocol):
    async def containers(self) -> Mapping[KubeletKey, frozenset[str]] | None:
        """kubelet's containers and the resources they hold devices of (pod-resources, asked
        now and bounded); None: kubelet did not answer (the last view stays)."""
        ...


class AllocateListener(Protocol):
    def allocated(self) -> None:
        """An Allocate went through (must not block: the pod-resources task wakes)."""
        ...


@dataclass(frozen=True, slots=True)
class Links:
    """What the node talks to besides the ledger, given at construction."""

    kubelet: KubeletView | None = None
    """Asked just before an Allocate that a pending container could be for (pod-resources on)."""
    listener: AllocateListener | None = None
    cdi_catalog: cdi.Catalog = field(default_factory=cdi.Catalog)
    """The device names the node's CDI specs define at start (then :meth:`Node.use_cdi`)."""


class Node:
    def __init__(
        self,
        settings: DevicePluginSettings,
        *,
        publish: Callable[[events.Event], None],
        initial_allocations: Sequence[events.AllocationEvent] = (),
        clock: Callable[[], float] = time.monotonic,
        partitions: Partitions | None = None,
        pending_containers: PendingSource = tuple,
        controls: Mapping[str, DriverControl] | None = None,
        links: Links = Links(),
    ) -> None:
        self._settings = settings
        self._controls = dict(controls or {})
        """Driver-step kind to the control that performs it."""
        self.claims = Claims(pending_containers)
        """Which pending container each grant serves (:mod:`claims`)."""
        self._kubelet = links.kubelet
        self._listener = links.listener
        self._publish = publish
        self._clock = clock
        self._instances = (
            Instances(partitions, self.claims, wait_s=settings.pending_wait_s)
            if partitions is not None
            else None
        )
        """Finds or creates a partitioned grant's MIG instance (:mod:`instances`); None:
        partitioned grants name ``<GPU>:<MIG>`` indexes of instances made by someone else."""
        self._retained: Sequence[events.AllocationEvent] | None = tuple(initial_allocations)
        self._cards: dict[str, resources.Card] = {}
        self._views: dict[str, allocation.View] = {}
        self._indexes: dict[str, _Index] = {}
        self._planned_for: tuple[dict[str, resources.Card], dict[str, resources.Mode]] | None = None
        self.ledger = ledger.Ledger()
        self.servicers: dict[Key, ResourceServicer] = {}
        self._cdi_catalog = links.cdi_catalog
        self.updated = False
        """False until the first :meth:`update`: nothing is served before detection has run."""

    @property
    def cdi_catalog(self) -> cdi.Catalog:
        """The device names the node's CDI specs define, as last read."""
        return self._cdi_catalog

    def use_cdi(self, catalog: cdi.Catalog) -> None:
        """Answer with ``catalog`` from now on (the specs were read again)."""
        self._cdi_catalog = catalog

    def _allocated(self) -> None:
        if self._listener is not None:
            self._listener.allocated()

    def update(self, groups: Sequence[devices.DeviceGroup]) -> None:
        """Adopt a detection pass: cards, health, servers. Held cards never lose their tokens."""
        fresh = resources.cards_of(groups)
        self._cards = resources.keep_held(fresh, self._cards, self.ledger.held_modes())
        self.updated = True
        self._refresh()
        if self._retained is not None:  # the first pass is when retained ids can be resolved
            retained, self._retained = self._retained, None
            changes = self.ledger.restore(retained, self._resolve, now=self._clock())
            for change in changes:  # what each kept holding served stays reserved
                if change.action == "allocated":
                    self.claims.restore(change.holding)
            self._apply(changes)

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
        record = self._instances.recorded(resource, device_ids) if self._instances else None
        view = self._views.get(resource)
        card = self._cards.get(record.card_id) if record is not None else None
        if view is not None and card is not None:
            holding = allocation.partition_holding(view, device_ids, card, now=0.0)
            return view.mode, holding.charges
        return allocation.resolve(self._views, resource, device_ids)

    def _apply(self, changes: Sequence[ledger.Change]) -> None:
        for change in changes:
            self._publish(change.event(self._settings.node_name))
            if change.action == "released":
                self.claims.release(change.holding.allocation_id)
                workdirs.remove(self._settings.host_work_dir, change.holding.allocation_id)
                if self._instances is not None and change.holding.mode == "partitioned":
                    self._instances.released(change.holding.allocation_id)
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
        if view.mode == "visibility":
            injection = self._mirror(key, view, device_ids)
        else:
            injection = self._respond(grant)
        self._prepare(grant, injection)
        if (
            grant.holding is not None
            and self.ledger.holder(grant.holding.resource, grant.holding.device_ids) is None
        ):
            if grant.request is not None:
                self.claims.reserve(grant.holding.allocation_id, grant.request)
            self._apply(self.ledger.charge(grant.holding))
        self._allocated()
        return injection

    def _prepare(self, grant: allocation.Grant, injection: Injection) -> None:
        """The host side of ``injection``: its directories, its files, then its driver steps.

        When one fails, a new allocation's work directory is removed again, so a refused request
        leaves nothing on the host either (a retry of a charged allocation keeps its own).
        """
        try:
            workdirs.make_dirs(injection.host_dirs)
            workdirs.write_files(injection.files)
            self._perform(injection.steps)
        except BaseException:
            held = grant.holding
            if held is not None and self.ledger.holder(held.resource, held.device_ids) is None:
                workdirs.remove(self._settings.host_work_dir, held.allocation_id)
            raise

    def _respond(self, grant: allocation.Grant) -> Injection:
        injection = responders.respond(
            grant,
            host_lib_dir=self._settings.host_lib_dir,
            host_work_dir=self._settings.host_work_dir,
        )
        if grant.cards and grant.cards[0][0].manufacturer == "nvidia":
            cards = [(c.id, c.index) for c, _ in grant.cards]
            injection = cdi.channel(
                self._settings.nvidia_injection, injection, self._cdi_catalog, cards
            )
        return injection

    def _mirror(self, key: Key, view: allocation.View, device_ids: Sequence[str]) -> Injection:
        """A visibility grant: the owning container's cards or partition (:mod:`mirroring`).

        The claim a grant mirrored for is remembered by allocation id, so a kubelet retry gets
        the same answer and the next sidecar is matched to another Pod's claim.
        """
        alloc = ledger.allocation_id(view.resource, device_ids)
        claim = self.claims.mirrored_claim(alloc, view.resource, len(device_ids))
        if claim is None:
            raise errors.Conflict(
                f"no pending container on this node asks for {len(device_ids)} {view.resource}; "
                "a visibility request only mirrors its Pod's owner, so it is refused"
            )
        found = mirroring.mirror(
            claim, self.ledger.holdings(), self._cards, manufacturer=key[0], size=len(device_ids)
        )
        self.claims.note_mirrored(alloc, claim)
        if found.partition_id is not None:
            return Injection(envs={"NVIDIA_VISIBLE_DEVICES": found.partition_id})
        grant = allocation.Grant(
            mode="visibility", cards=tuple((c, (0,)) for c in found.cards), holding=None
        )
        return self._respond(grant)

    def _request(self, view: allocation.View, device_ids: Sequence[str]) -> PendingContainer | None:
        """The pending container a sliced, exclusive or shared Allocate serves (the one it
        served, on a retry); None: no pending record for it (a sliced grant is then today's
        token share; an exclusive or shared one just goes unnamed until pod-resources names it,
        and is named from a claim only when kubelet's view identifies it).

        The choice (:meth:`Claims.choose`): the pending container kubelet's pod-resources lists
        without a device of this resource yet (asked just before, :meth:`ask_kubelet_first`),
        else the oldest feasible one.
        """
        if view.mode not in ("sliced", "exclusive", "shared"):
            return None
        served = self.claims.reserved(ledger.allocation_id(view.resource, device_ids))
        if served is not None:
            return served
        if view.mode != "sliced":
            return self.claims.identified(view.resource, len(device_ids))
        cards = {view.tokens[d].card for d in device_ids if d in view.tokens}
        return self.claims.choose(view.resource, len(device_ids), self._remaining(view, cards))

    def _remaining(self, view: allocation.View, cards: Iterable[str]) -> dict[str, int] | None:
        """What a sliced choice must fit in (None: any other mode, where units do not decide)."""
        return {c: self.ledger.remaining(c) for c in cards} if view.mode == "sliced" else None

    async def ask_kubelet_first(self) -> None:
        """Refresh kubelet's view when a pending container could be the one allocated for."""
        if self._kubelet is not None and self.claims.pending():
            containers = await self._kubelet.containers()
            if containers is not None:
                self.claims.note_kubelet(containers)

    async def allocate_partitioned(self, key: Key, device_ids: Sequence[str]) -> Injection:
        """Give the container its own MIG instance (:meth:`Instances.get`: the one recorded for
        this allocation, else a new one). The ledger is charged only once the instance and its
        record exist, so a failure changes nothing.
        """
        if self._instances is None or key[0] != MIG_MANUFACTURER:
            return self.allocate(key, device_ids)
        view = self._view(key)
        record, request = await self._instances.get(view, device_ids, self._cards)
        card = self._cards.get(record.card_id)
        if card is not None and self.ledger.holder(view.resource, device_ids) is None:
            holding = allocation.partition_holding(
                view, device_ids, card, now=self._clock(), request=request
            )
            holding = replace(holding, profile=record.profile_name, partition_id=record.mig_uuid)
            if request is not None:
                self.claims.reserve(ledger.allocation_id(view.resource, device_ids), request)
            self._apply(self.ledger.charge(holding))
        self._allocated()
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

    def prefer(
        self, key: Key, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """GetPreferredAllocation: for a sliced request, the units and slot of the container it
        is most likely for (the one Allocate will choose), so no card is suggested that the
        sliced gate would then refuse."""
        view = self._view(key)
        charge = None
        if view.mode == "sliced":
            cards = {view.tokens[d].card for d in available if d in view.tokens}
            request = self.claims.choose(view.resource, size, self._remaining(view, cards))
            charge = request.units if request is not None else None
        return allocation.prefer(
            view,
            self.ledger,
            available=available,
            must_include=must_include,
            size=size,
            charge=charge,
        )

    def reconcile(self, live: Sequence[ledger.LiveContainer]) -> None:
        """Agree with kubelet's pod-resources list (names, missed and finished allocations)."""
        ours = [c for c in live if c.resource in self._views]
        grace = self._settings.release_grace_s
        self._apply(self.ledger.reconcile(ours, self._resolve, now=self._clock(), grace_s=grace))

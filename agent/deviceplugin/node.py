"""The node's device-plugin state: the ledger and its transactions, wiring the two sides.

Synchronous and owned by the event loop thread: every method runs to completion without an
``await``, so two Allocate calls on different servers can never interleave halfway (this is the
node-wide mutex of other plugins, for free). Every ledger change is published, then the offer is
refreshed, because holding a card in one mode makes its tokens of the other modes Unhealthy.

:class:`Node` keeps the ledger's transactions: Allocate (and its partitioned form, whose MIG
instance and the wait for its claim are :mod:`instances`'), GetPreferredAllocation, the
reconcile with kubelet's pod-resources list, and the restore of retained allocations on the
first detection pass. What it offers and what it injects are two parts it wires together:

- :mod:`offers` (:class:`~agent.deviceplugin.offers.Offers`, ``node.offers``): the cards, the
  servicer of each resource (``node.offers.servicers``), the per-resource views and token
  indexes, and the charges an allocation resolves to. Allocate is the hot path, so refreshing
  stops at once unless the cards or a card's held mode changed, and re-keys only the lists that
  changed.
- :mod:`injecting` (:class:`~agent.deviceplugin.injecting.Injector`, ``node.injector``): the
  vendor's answer, the NVIDIA device channel from the CDI catalog (``node.injector.use_cdi``),
  a visibility sidecar's mirror, and the host side of an injection (work directories, their
  files, driver steps through the registered :data:`~agent.deviceplugin.injecting.DriverControl`;
  a step with no control refuses the grant).

Both were once methods of :class:`Node` itself: ``servicers``, ``_refresh``, ``_reindex``,
``_view``, ``_resolve`` and ``partitioned_cards`` are now :class:`Offers`' (``refresh``,
``view``, ``resolve``); ``cdi_catalog``, ``use_cdi``, ``_respond``, ``_mirror``, ``_prepare``
and ``_perform`` are :class:`Injector`'s (``inject``, ``perform``), and ``DriverControl`` lives
in :mod:`injecting`.

Invariants: a grant is charged only after its injection was built and its host side prepared,
so a refused request changes nothing in the ledger; the ledger is written here only (the two
sides read it); which pending container a grant serves is :class:`Claims`' table, reserved and
released here (and by :mod:`instances` around an instance's creation); a released allocation's
work directory is removed with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from agent.deviceplugin import allocation, cdi, workdirs
from agent.deviceplugin import holdings as ledger
from agent.deviceplugin.claims import Claims, KubeletKey, PendingSource
from agent.deviceplugin.injecting import DriverControl, Injector
from agent.deviceplugin.injection import Injection
from agent.deviceplugin.instances import MIG_MANUFACTURER, Instances
from agent.deviceplugin.offers import Offers
from agent.deviceplugin.partitioning import Partitions
from agent.deviceplugin.server import Key
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices, events
from bus.records import PendingContainer


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
    """The device names the node's CDI specs define at start (then :meth:`Injector.use_cdi`)."""


def _quiet() -> None:
    """No one to tell that an Allocate went through."""


class Node:
    """The ledger's transactions, wiring the offer side and the injection side."""

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
        self.claims = Claims(pending_containers)
        """Which pending container each grant serves (:mod:`claims`)."""
        self._kubelet = links.kubelet
        self._allocated = links.listener.allocated if links.listener is not None else _quiet
        """Told after every Allocate that went through."""
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
        self.ledger = ledger.Ledger()
        recorded = self._instances.recorded if self._instances is not None else None
        self.offers = Offers(settings, self, recorded=recorded)
        """Cards, servicers and views (:mod:`offers`)."""
        self.injector = Injector(
            settings, self.claims, self.ledger, controls=controls, cdi_catalog=links.cdi_catalog
        )
        """What a grant injects, and its host side (:mod:`injecting`)."""
        self.updated = False
        """False until the first :meth:`update`: nothing is served before detection has run."""

    def update(self, groups: Sequence[devices.DeviceGroup]) -> None:
        """Adopt a detection pass: cards, health, servers. Held cards never lose their tokens."""
        self.offers.adopt(groups, self.ledger.held_modes())
        self.updated = True
        if self._retained is not None:  # the first pass is when retained ids can be resolved
            retained, self._retained = self._retained, None
            changes = self.ledger.restore(retained, self.offers.resolve, now=self._clock())
            for change in changes:  # what each kept holding served stays reserved
                if change.action == "allocated":
                    self.claims.restore(change.holding)
            self._apply(changes)

    def _apply(self, changes: Sequence[ledger.Change]) -> None:
        for change in changes:
            self._publish(change.event(self._settings.node_name))
            if change.action == "released":
                self.claims.release(change.holding.allocation_id)
                workdirs.remove(self._settings.host_work_dir, change.holding.allocation_id)
                if self._instances is not None and change.holding.mode == "partitioned":
                    self._instances.released(change.holding.allocation_id)
        if changes:
            self.offers.refresh(self.ledger.held_modes())

    def allocate(self, key: Key, device_ids: Sequence[str]) -> Injection:
        """Decide, build the injection, prepare its host directories, then charge: a refused
        request changes nothing in the ledger."""
        view = self.offers.view(key)
        request = self._request(view, device_ids)
        grant = allocation.decide(view, device_ids, self.ledger, now=self._clock(), request=request)
        injection = self.injector.inject(key, view, device_ids, grant, self.offers.cards)
        if (
            grant.holding is not None
            and self.ledger.holder(grant.holding.resource, grant.holding.device_ids) is None
        ):
            if grant.request is not None:
                self.claims.reserve(grant.holding.allocation_id, grant.request)
            self._apply(self.ledger.charge(grant.holding))
        self._allocated()
        return injection

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
        view = self.offers.view(key)
        record, request = await self._instances.get(view, device_ids, self.offers.cards)
        card = self.offers.cards.get(record.card_id)
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

    def held_partitions(self) -> set[str]:
        return {h.allocation_id for h in self.ledger.holdings() if h.mode == "partitioned"}

    def prefer(
        self, key: Key, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """GetPreferredAllocation: for a sliced request, the units and slot of the container it
        is most likely for (the one Allocate will choose), so no card is suggested that the
        sliced gate would then refuse."""
        view = self.offers.view(key)
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
        ours = [c for c in live if self.offers.serves(c.resource)]
        grace = self._settings.release_grace_s
        self._apply(
            self.ledger.reconcile(ours, self.offers.resolve, now=self._clock(), grace_s=grace)
        )

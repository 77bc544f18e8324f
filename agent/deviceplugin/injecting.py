"""What a grant injects into its container, and the host side done before Allocate answers.

The injection side of :class:`~agent.deviceplugin.node.Node`. :class:`Injector` turns a decided
grant into the :class:`~agent.deviceplugin.injection.Injection` kubelet is answered with: a
vendor's runtime answer (:mod:`responders`), NVIDIA's device channel picked from the CDI catalog
(:mod:`cdi`), or, for a visibility sidecar, what its Pod's owner holds (:mod:`mirroring`). It then
prepares the host for it: the work directories and files a slicing runtime reads
(:mod:`workdirs`), and the driver steps (:class:`injection.DriverStep`) performed through the
control registered for each step's kind.

Invariants:

- The ledger is only read here, never charged or released: the node charges a grant after
  :meth:`Injector.inject` returned, so a refused injection leaves the ledger as it was.
- A failed preparation removes the work directory of an allocation the ledger does not hold
  yet, so a refused request leaves nothing on the host either (a retry of a held allocation
  keeps its own).
- A step with no control registered for its kind refuses the grant
  (:class:`errors.CannotInject`, naming the step): a container never starts without the
  isolation its mode promises. Steps are performed in order; the first failure stops the rest.
- Of :class:`~agent.deviceplugin.claims.Claims`, only the mirrored memory changes here
  (``note_mirrored``): a kubelet retry of a visibility grant gets the same answer. Reserving
  and releasing claims is the node's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from agent.deviceplugin import allocation, cdi, errors, mirroring, resources, responders, workdirs
from agent.deviceplugin import holdings as ledger
from agent.deviceplugin.claims import Claims
from agent.deviceplugin.injection import DriverStep, Injection
from agent.deviceplugin.server import Key
from agent.deviceplugin.settings import DevicePluginSettings

DriverControl = Callable[[DriverStep], None]
"""Performs one driver step (idempotent: a retried Allocate asks again); raises
:class:`errors.ActuationFailed` when the driver refuses."""


class Injector:
    """Builds and prepares the injections of one node's grants (event-loop thread only)."""

    def __init__(
        self,
        settings: DevicePluginSettings,
        claims: Claims,
        holdings: ledger.Ledger,
        *,
        controls: Mapping[str, DriverControl] | None = None,
        cdi_catalog: cdi.Catalog | None = None,
    ) -> None:
        self._settings = settings
        self._claims = claims
        self._ledger = holdings
        """The node's ledger, read only (who holds an allocation, what a mirror sees)."""
        self._controls = dict(controls or {})
        """Driver-step kind to the control that performs it."""
        self._cdi_catalog = cdi_catalog if cdi_catalog is not None else cdi.Catalog()

    @property
    def cdi_catalog(self) -> cdi.Catalog:
        """The device names the node's CDI specs define, as last read."""
        return self._cdi_catalog

    def use_cdi(self, catalog: cdi.Catalog) -> None:
        """Answer with ``catalog`` from now on (the specs were read again)."""
        self._cdi_catalog = catalog

    def inject(
        self,
        key: Key,
        view: allocation.View,
        device_ids: Sequence[str],
        grant: allocation.Grant,
        cards: Mapping[str, resources.Card],
    ) -> Injection:
        """The injection of ``grant`` (``device_ids`` of ``view``), its host side prepared.

        :raises errors.Conflict: a visibility grant no pending container asks for.
        :raises errors.CannotInject: a step no control performs.
        """
        if view.mode == "visibility":
            injection = self._mirror(key, view, device_ids, cards)
        else:
            injection = self._respond(grant)
        self._prepare(grant, injection)
        return injection

    def _prepare(self, grant: allocation.Grant, injection: Injection) -> None:
        """The host side of ``injection``: its directories, its files, then its driver steps.

        When one fails, a new allocation's work directory is removed again, so a refused request
        leaves nothing on the host either (a retry of a charged allocation keeps its own).
        """
        try:
            workdirs.make_dirs(injection.host_dirs)
            workdirs.write_files(injection.files)
            self.perform(injection.steps)
        except BaseException:
            held = grant.holding
            if held is not None and self._ledger.holder(held.resource, held.device_ids) is None:
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

    def _mirror(
        self,
        key: Key,
        view: allocation.View,
        device_ids: Sequence[str],
        cards: Mapping[str, resources.Card],
    ) -> Injection:
        """A visibility grant: the owning container's cards or partition (:mod:`mirroring`).

        The claim a grant mirrored for is remembered by allocation id, so a kubelet retry gets
        the same answer and the next sidecar is matched to another Pod's claim.
        """
        alloc = ledger.allocation_id(view.resource, device_ids)
        claim = self._claims.mirrored_claim(alloc, view.resource, len(device_ids))
        if claim is None:
            raise errors.Conflict(
                f"no pending container on this node asks for {len(device_ids)} {view.resource}; "
                "a visibility request only mirrors its Pod's owner, so it is refused"
            )
        found = mirroring.mirror(
            claim, self._ledger.holdings(), cards, manufacturer=key[0], size=len(device_ids)
        )
        self._claims.note_mirrored(alloc, claim)
        if found.partition_id is not None:
            return Injection(envs={"NVIDIA_VISIBLE_DEVICES": found.partition_id})
        grant = allocation.Grant(
            mode="visibility", cards=tuple((c, (0,)) for c in found.cards), holding=None
        )
        return self._respond(grant)

    def perform(self, steps: Sequence[DriverStep]) -> None:
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

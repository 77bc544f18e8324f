"""The device plugins of one node as one async context manager: :func:`device_plugins`.

Nothing is bound or registered until the first :meth:`Plugins.update` (a detection pass), so
kubelet never sees a server with an empty list that a moment later fills. Leaving the context
cancels the registration task, whose shielded, time-bounded cleanup closes every server and
removes every socket file, whatever it was doing (binding, registering, waiting).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from agent.deviceplugin import cdi, podresources
from agent.deviceplugin.claims import KubeletKey
from agent.deviceplugin.holdings import Ledger
from agent.deviceplugin.injecting import DriverControl
from agent.deviceplugin.node import Links, Node
from agent.deviceplugin.partitioning import MigControl, Partitions
from agent.deviceplugin.registration import Registrar
from agent.deviceplugin.server import Key, ResourceServicer
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices, events
from bus.records import PendingContainer

log = logging.getLogger(__name__)

KUBELET_ASK_S = 1.0
"""The longest an Allocate waits for kubelet's pod-resources list to identify its container."""
POD_RESOURCES_DELAY_S = 0.5
"""After an Allocate, how long to give kubelet to record the container before asking it."""


class Allocations:
    """The node's :class:`AllocateListener`: an event set (and replaced) after every Allocate,
    so pod-resources is asked soon after."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def allocated(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def wait(self) -> None:
        """Return after the next Allocate."""
        await self._event.wait()


class PodResources:
    """The node's :class:`KubeletView` over kubelet's pod-resources socket: which containers it
    lists and what they hold, bounded by :data:`KUBELET_ASK_S` (an unanswered ask leaves the
    last view: the choice falls back to the oldest feasible pending container)."""

    def __init__(self, path: str) -> None:
        self._path = path

    async def containers(self) -> Mapping[KubeletKey, frozenset[str]] | None:
        try:
            return await podresources.list_containers(self._path, timeout_s=KUBELET_ASK_S)
        except podresources.PodResourcesUnavailable as e:
            log.debug("%s", e)
            return None


class Plugins:
    """The handle :func:`device_plugins` yields. Use it from the event loop thread only."""

    def __init__(self, node: Node, registrar: Registrar) -> None:
        self._node = node
        self._registrar = registrar

    def update(self, groups: Sequence[devices.DeviceGroup]) -> None:
        """Adopt a detection pass or health transition; never blocks.

        Servers appear and disappear per (manufacturer, mode) as ``groups`` require; a server's
        ListAndWatch streams get the full list again only when its tokens or health changed.
        """
        self._node.update(groups)
        self._registrar.wake()

    def ledger(self) -> Ledger:
        """A snapshot of the ledger that later changes do not affect."""
        return self._node.ledger.copy()

    @property
    def registrations(self) -> int:
        """Successful Register calls so far (every server, every kubelet generation)."""
        return self._registrar.registrations

    def connected(self) -> bool:
        """Every resource is registered with the kubelet that is there now."""
        return self._registrar.connected()

    def servicers(self) -> dict[Key, ResourceServicer]:
        return dict(self._node.offers.servicers)

    def cdi_catalog(self) -> cdi.Catalog:
        """The CDI device names the node answers with, as last read."""
        return self._node.injector.cdi_catalog


@asynccontextmanager
async def device_plugins(
    settings: DevicePluginSettings,
    *,
    publish: Callable[[events.Event], None],
    initial_allocations: Sequence[events.AllocationEvent] = (),
    mig: MigControl | None = None,
    pending: Callable[[], Sequence[PendingContainer]] = tuple,
    controls: Mapping[str, DriverControl] | None = None,
) -> AsyncIterator[Plugins]:
    """Serve and register the node's device plugins while the context is open.

    ``publish`` gets an :class:`events.AllocationEvent` for every ledger change; it must not
    block (the bus publisher's outbox). ``initial_allocations`` are the retained ``allocated``
    events of this node, re-charged on the first update. ``mig`` (NVIDIA:
    ``partitioning.NvmlMig(nvml_adapter)``) makes ``<base>.partitioned`` create and reclaim MIG
    instances; without it partitioned grants name instances someone else made. ``pending``
    returns the node's pending containers (:mod:`agent.deviceplugin.kvpending`): a sliced Allocate serving
    one is charged and capped by its own request. ``controls`` perform the driver steps some
    vendors' grants need (:class:`injection.DriverStep`), by kind; a grant needing a step no
    control performs is refused.
    """
    partitions = await _partitions(settings, mig)
    allocations = Allocations()
    node = Node(
        settings,
        publish=publish,
        initial_allocations=initial_allocations,
        partitions=partitions,
        pending_containers=pending,
        controls=controls,
        links=await _links(settings, allocations),
    )
    registrar = Registrar(settings, lambda: node.offers.servicers, ready=lambda: node.updated)
    plugins = Plugins(node, registrar)
    async with anyio.create_task_group() as tg:
        _start_loops(tg, settings, node, registrar, allocations, partitions)
        try:
            yield plugins
        finally:
            tg.cancel_scope.cancel()


async def _partitions(settings: DevicePluginSettings, mig: MigControl | None) -> Partitions | None:
    """A step of its own: the MIG partitions are loaded before the node exists, so the first
    update restores retained allocations against them."""
    if mig is None:
        return None
    partitions = Partitions(
        mig,
        settings.host_work_dir,
        destroy_attempts=settings.partition_destroy_attempts,
        destroy_backoff_s=settings.partition_destroy_backoff_s,
        debounce_s=settings.partition_orphan_debounce_s,
    )
    await partitions.load()  # before the first update restores retained allocations
    return partitions


async def _links(settings: DevicePluginSettings, allocations: Allocations) -> Links:
    """A step of its own: what the node sees of kubelet and CDI, each present only where the
    settings ask for it."""
    socket = settings.pod_resources_socket
    return Links(
        kubelet=PodResources(socket) if socket is not None else None,
        listener=allocations,
        cdi_catalog=await _read_cdi(settings)
        if settings.nvidia_injection != "envvar"
        else cdi.Catalog(),
    )


def _start_loops(
    tg: TaskGroup,
    settings: DevicePluginSettings,
    node: Node,
    registrar: Registrar,
    allocations: Allocations,
    partitions: Partitions | None,
) -> None:
    """A step of its own: the background loops the context runs, registration first, each
    started only when its part exists."""
    tg.start_soon(registrar.run, name="deviceplugin-registration")
    if settings.pod_resources_socket is not None:
        tg.start_soon(_resync, settings, node, allocations, name="deviceplugin-podresources")
    if partitions is not None:
        tg.start_soon(_reclaim, settings, node, partitions, name="deviceplugin-mig-reclaim")
    if settings.nvidia_injection != "envvar":
        tg.start_soon(_refresh_cdi, settings, node, name="deviceplugin-cdi-specs")


async def _resync(settings: DevicePluginSettings, node: Node, allocations: Allocations) -> None:
    """Ask kubelet who holds what: shortly after each Allocate and every period."""
    path = settings.pod_resources_socket
    assert path is not None
    while True:
        with anyio.move_on_after(settings.pod_resources_period_s):
            await allocations.wait()
            await anyio.sleep(POD_RESOURCES_DELAY_S)
        if not node.updated:
            continue
        try:
            live = await podresources.list_live(path, timeout_s=settings.register_timeout_s)
        except podresources.PodResourcesUnavailable as e:
            log.debug("%s", e)
            continue
        node.reconcile(live)


async def _read_cdi(settings: DevicePluginSettings) -> cdi.Catalog:
    return await anyio.to_thread.run_sync(cdi.read_catalog, settings.cdi_spec_dirs)


async def _refresh_cdi(settings: DevicePluginSettings, node: Node) -> None:
    """Read the CDI specs again every period: they may be generated after the agent started."""
    while True:
        await anyio.sleep(settings.cdi_refresh_s)
        node.injector.use_cdi(await _read_cdi(settings))


async def _reclaim(settings: DevicePluginSettings, node: Node, partitions: Partitions) -> None:
    """Level-based MIG reclaim: every period, and soon after a partitioned release."""
    while True:
        with anyio.move_on_after(settings.partition_resync_s):
            await partitions.wake.wait()
        if not node.updated:
            continue
        try:
            await partitions.reclaim(
                node.offers.partitioned_cards(), node.held_partitions(), anyio.current_time()
            )
        except Exception:  # one bad pass must not end reclaim for the process's life
            log.exception("MIG reclaim pass failed")

"""``dm serve``: the per-node device agent's composition root.

The process is one task group (:func:`run`); each long-lived part is a child that signals
readiness with ``tg.start``, and shutdown is the same tree unwound (every cleanup shielded and
time-bounded by its owner):

1. the bus publisher, created before any connection: its outbox keeps the latest state (and a
   bounded number of samples) until NATS answers;
2. the backends (real NVML/sysfs, or a simulated tree and NVML), open for the whole process;
3. the bus link (not awaited: with NATS unreachable the agent still serves kubelet and metrics;
   :func:`bus.publishing.link` attaches the publisher, the access reviewer and the follower of
   this node's pending containers (:mod:`agent.kvpending`) whenever the connection comes up);
4. HTTPS (``/metrics``, ``/readyz``, ``/livez``, ``/monitor/snapshot``); with
   ``--metrics-auth=review``, the non-probe routes ask the worker (503 while they cannot);
5. the device plugins (bound and registered on the first :meth:`Plugins.update`), their ledger
   rebuilt from the bus's retained history, or from the copy kept on the node
   (:mod:`agent.ledgerfile`) when the bus cannot be read at start;
6. the observer: one pass every monitor period (detection, sampling, health re-check), started
   with the plugins it pushes to, once the first pass is published;
7. the XID watcher (NVIDIA only) and the heartbeat.

Objects are built in dependency order: the metrics the observer writes exist before it, the
scrape-time view that reads it is registered after it (:func:`agent.metrics.register_view`).

Every decision is made synchronously by :class:`agent.health.HealthBook` and
:func:`agent.health.overlay`; this module only moves data between the threads, the bus, kubelet
and the scrape endpoint. All mutable state lives on the event loop thread.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
from prometheus_client import CollectorRegistry, Histogram

from agent import health, kvpending, ledgerfile, metrics, restoring, watching
from agent.deviceplugin import partitioning
from agent.deviceplugin.controls import driver_controls
from agent.deviceplugin.ledger import Change
from agent.deviceplugin.node import DriverControl
from agent.deviceplugin.running import Plugins, device_plugins
from agent.devices import detection, nvidia, sources
from agent.devices.nvml import Nvml
from agent.errors import StartFailed
from agent.serve_settings import ServeSettings
from bus import devices, events
from bus.errors import BusError
from bus.metrics import BusMetrics
from bus.publishing import Publisher, link, publisher
from bus.reviewing import BusReviewer
from kit import serving

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Running:
    """What :func:`run` hands its starter once the agent is ready (tests, benchmarks)."""

    observer: Observer
    server: serving.Server
    plugins: Plugins
    backends: Sequence[detection.Backend]
    publisher: Publisher
    pending: kvpending.PendingView


async def run(
    settings: ServeSettings,
    *,
    task_status: anyio.abc.TaskStatus[Running] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """The whole agent; ``task_status.started`` once the first pass is published.

    :raises StartFailed: kubelet's device-plugins directory is not where ``--kube-socket`` says.
    """
    require_plugin_directory(settings.deviceplugin.kube_socket)
    registry = CollectorRegistry(auto_describe=True)
    async with (
        # The worker creates the streams; an agent may not (bus.identity).
        publisher(settings=settings.bus, metrics=BusMetrics(registry), ensure_streams=False) as pub,
        opened_backends(settings) as backends,
        anyio.create_task_group() as tg,
    ):
        publish = functools.partial(publish_logged, pub)
        observer = Observer(settings, backends, publish, metrics.AgentMetrics(registry))
        pub.on_reconnect(observer.republish)
        metrics.register_view(registry, observer.metric_sources(outbox_depth=lambda: pub.pending))
        reviewer = BusReviewer(settings.node_name)
        pending = kvpending.PendingView()
        tg.start_soon(
            functools.partial(
                link, pub, settings.bus, name=f"agent/{settings.node_name}",
                also=(reviewer.attach, kvpending.attach(pending, settings.node_name)),
            ),
            name="bus-link",
        )  # fmt: skip
        server = await tg.start(serve_https, settings, registry, observer, reviewer, name="https")
        plugins = await start_plugins(
            tg, settings, publish, mig_control(backends), pending, driver_controls(backends)
        )
        await tg.start(observer.observe, plugins, name="observer")
        for nvml in observer.nvml_adapters():
            tg.start_soon(
                functools.partial(
                    watching.watch_xids,
                    nvml,
                    on_xid=observer.on_xid,
                    on_failure=observer.wake,
                    wait_s=settings.xid_wait_s,
                    retry_s=settings.monitor_period_s,
                ),
                name="xid-watcher",
            )
        tg.start_soon(observer.heartbeat, name="heartbeat")
        log.info("device agent ready on node %s (HTTPS %s)", settings.node_name, server.url)
        task_status.started(Running(observer, server, plugins, backends, pub, pending))


def require_plugin_directory(kube_socket: str) -> None:
    """Fail at once, in one line, when there is no directory to put the plugin sockets in."""
    directory = os.path.dirname(kube_socket) or "."
    if not os.path.isdir(directory):
        raise StartFailed(
            f"--kube-socket {kube_socket}: the directory {directory} does not exist "
            "(is kubelet's device-plugins directory mounted there?)"
        )


# -- the parts --------------------------------------------------------------------------------


@asynccontextmanager
async def opened_backends(settings: ServeSettings) -> AsyncIterator[list[detection.Backend]]:
    """The backends, open for the life of the process (a simulated tree is laid out once).

    Opening and closing touch the file system, so both run in a worker thread; the close is
    shielded, so a cancelled start leaves no temporary tree behind.
    """
    stack = ExitStack()
    try:
        backends: list[detection.Backend] = await anyio.to_thread.run_sync(
            stack.enter_context, sources.open_backends(settings.detect)
        )
        yield backends
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(stack.close)


def publish_logged(pub: Publisher, event: events.Event) -> None:
    """``pub.publish`` for the agent's parts, which must not fail because the bus refuses.

    The refusals are permanent (a node name that cannot be a subject; a publish after shutdown):
    say so and keep serving kubelet and metrics. Connectivity is never a refusal: the
    publisher's outbox holds events until its link is up.
    """
    try:
        pub.publish(event)
    except BusError as e:
        log.error("cannot publish %s event: %s", events.kind_of(event), e)


async def serve_https(
    settings: ServeSettings,
    registry: CollectorRegistry,
    observer: Observer,
    reviewer: BusReviewer,
    *,
    task_status: anyio.abc.TaskStatus[serving.Server],
) -> None:
    async with (
        serving.https_server(
            settings.https,
            registry=registry,
            ready=observer.is_ready,
            routes={"/monitor/snapshot": observer.snapshot},
            authorizer=reviewer,
        ) as server,
        _plain_metrics(settings, registry) as plain,
    ):
        if plain is not None:
            log.warning(
                "serving /metrics over plain HTTP on %s to anyone, without tokens", plain.url
            )
        task_status.started(server)
        await anyio.sleep_forever()


@asynccontextmanager
async def _plain_metrics(
    settings: ServeSettings, registry: CollectorRegistry
) -> AsyncIterator[serving.Server | None]:
    """``--metrics-port``: the same registry over plain HTTP, or nothing when it is 0."""
    if not settings.metrics_http_port:
        yield None
        return
    async with serving.http_metrics_server(
        settings.https.bind_address, settings.metrics_http_port, registry
    ) as plain:
        yield plain


def mig_control(backends: Sequence[detection.Backend]) -> partitioning.NvmlMig | None:
    """MIG actuation through the NVIDIA backend's own NVML adapter (a simulated run included).

    The same adapter, so the instances a ``--simulate`` run creates are the ones it detects.
    """
    for backend in backends:
        if isinstance(backend, nvidia.NvidiaBackend):
            return partitioning.NvmlMig(backend.nvml)
    return None


async def start_plugins(
    tg: anyio.abc.TaskGroup,
    settings: ServeSettings,
    publish: Callable[[events.Event], None],
    mig: partitioning.MigControl | None,
    pending: kvpending.PendingView,
    controls: Mapping[str, DriverControl] | None = None,
) -> Plugins:
    """Rebuild the ledger (the bus's history, else the node's copy), keep that copy current
    with every ledger change, then serve the device plugins."""
    retained = await restoring.initial_allocations(settings)
    kept = ledgerfile.LedgerFile(settings.ledger_path, settings.node_name, retained)
    await tg.start(kept.keep, name="ledger-file")

    def noted(event: events.Event) -> None:
        kept.note(event)
        publish(event)

    plugins: Plugins = await tg.start(
        serve_plugins, settings, noted, retained, mig, pending, controls, name="device-plugins"
    )
    return plugins


async def serve_plugins(
    settings: ServeSettings,
    publish: Callable[[events.Event], None],
    initial_allocations: Sequence[events.AllocationEvent] = (),
    mig: partitioning.MigControl | None = None,
    pending: kvpending.PendingView | None = None,
    controls: Mapping[str, DriverControl] | None = None,
    *,
    task_status: anyio.abc.TaskStatus[Plugins],
) -> None:
    async with device_plugins(
        settings.deviceplugin,
        publish=publish,
        initial_allocations=initial_allocations,
        mig=mig,
        pending=pending or tuple,
        controls=controls,
    ) as plugins:
        task_status.started(plugins)
        await anyio.sleep_forever()


# -- the observer -------------------------------------------------------------------------------


class Observer:
    """Detection, sampling and health for the node; owns the published view.

    Mutated only on the event loop thread: passes run in a worker thread and hand back plain
    values; XIDs arrive through :meth:`on_xid` on the loop. Every event goes to ``publish``
    (the bus publisher's, which never blocks); the device plugins to push the view to are given
    to :meth:`observe`, the loop that feeds them (:attr:`plugins` is None until it starts).
    """

    def __init__(
        self,
        settings: ServeSettings,
        backends: Sequence[detection.Backend],
        publish: Callable[[events.Event], None],
        agent_metrics: metrics.AgentMetrics,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.publish = publish
        self.metrics = agent_metrics
        self.book = health.HealthBook(quarantine_s=settings.health_quarantine_s)
        self.plugins: Plugins | None = None
        self.detected: list[devices.DeviceGroup] = []
        self.published: list[devices.DeviceGroup] = []
        self.samples: list[devices.MonitorSample] = []
        self.last_samples: events.SamplesEvent | None = None
        self.last_xids: dict[str, int] = {}
        self.passes = 0
        self._limiter = anyio.CapacityLimiter(1)
        self._wake = anyio.Event()
        self._devices_sent_at: float | None = None
        self._started_at = events.now()

    # -- what others read -----------------------------------------------------------------------

    def is_ready(self) -> bool:
        """A pass is published and kubelet holds every plugin's registration."""
        return self.passes > 0 and self.plugins is not None and self.plugins.connected()

    async def snapshot(self) -> serving.Response:
        if self.last_samples is None:
            return serving.Response(status=503, body=b"no sample yet\n")
        body = msgspec.json.encode(self.last_samples)
        return serving.Response(body=body, content_type="application/json")

    def nvml_adapters(self) -> list[Nvml]:
        return [b.nvml for b in self.backends if isinstance(b, nvidia.NvidiaBackend)]

    def metric_sources(self, *, outbox_depth: Callable[[], int]) -> metrics.Sources:
        def nvml_errors() -> dict[str, int]:
            total: dict[str, int] = {}
            for nvml in self.nvml_adapters():
                for call, count in nvml.errors_by_call.items():
                    total[call] = total.get(call, 0) + count
            return total

        return metrics.Sources(
            node=self.settings.node_name,
            view=lambda: (self.published, self.samples),
            nvml_errors=nvml_errors,
            outbox_depth=outbox_depth,
            registrations=lambda: self.plugins.registrations if self.plugins else 0,
            holders=self.holders,
            xids=lambda: self.last_xids,
        )

    def holders(self) -> dict[str, list[metrics.Holder]]:
        """Accelerator id -> the containers holding it, as far as kubelet named them (its
        pod-resources API fills the names in; an allocation it has not reported yet has none)."""
        out: dict[str, list[metrics.Holder]] = {}
        for h in self.plugins.ledger().holdings() if self.plugins is not None else ():
            if h.pod_name is None:
                continue
            holder = (h.pod_namespace or "", h.pod_name, h.container or "")
            for card, _units in h.charges:
                if holder not in out.setdefault(card, []):
                    out[card].append(holder)
        return out

    # -- loops ----------------------------------------------------------------------------------

    async def observe(self, plugins: Plugins, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """A pass now, ready, then a pass every monitor period (sooner when woken).

        Every pass and health transition from now on is pushed to ``plugins``.
        """
        self.plugins = plugins
        await self.pass_once(first=True)
        task_status.started()
        while True:
            with anyio.move_on_after(self.settings.monitor_period_s):
                await self._wake.wait()
            self._wake = anyio.Event()
            await self.pass_once()

    def wake(self) -> None:
        """Run the next pass now (the XID watcher lost its event set)."""
        self._wake.set()

    async def heartbeat(self) -> None:
        while True:
            self.publish(self._agent_event())
            await anyio.sleep(self.settings.heartbeat_s)

    def _agent_event(self) -> events.AgentEvent:
        return events.AgentEvent(
            node=self.settings.node_name,
            version=self.settings.version,
            capabilities=tuple(sorted(b.manufacturer for b in self.backends)),
            started_at=self._started_at,
            heartbeat_s=self.settings.heartbeat_s,
        )

    def republish(self) -> None:
        """Publish the node's whole state again: the bus may have lost it (a reconnect).

        Devices (once a pass published them), every card that is down now, every allocation
        the device plugins hold, and the agent record. Repeats are harmless: the same devices,
        an allocation already known, a card already known to be down. Healthy cards need no
        event: the devices event says so.
        """
        node = self.settings.node_name
        if self.passes:
            self.publish(events.DevicesEvent(node=node, groups=tuple(self.published)))
        for accelerator_id in sorted(self.book.unhealthy_ids):
            down = self.book.down(accelerator_id)
            if down is not None:
                self.publish(down.event(node, accelerator_id))
        if self.plugins is not None:
            for holding in self.plugins.ledger().holdings():
                self.publish(Change("allocated", holding).event(node))
        self.publish(self._agent_event())

    # -- one pass ---------------------------------------------------------------------------------

    async def pass_once(self, *, first: bool = False) -> None:
        detect = functools.partial(
            detection.detect,
            self.backends,
            fast_failed=first and self.settings.detect.fast_failed,
            retries=self.settings.detect.retries,
            retry_delay_s=self.settings.detect.retry_delay_s,
        )
        found = await self._timed(detect, self.metrics.detection_seconds)
        sampled = await self._timed(
            functools.partial(detection.sample, self.backends), self.metrics.monitor_seconds
        )
        failed = {e.manufacturer for e in (*found.errors, *sampled.errors)}
        for error in (*found.errors, *sampled.errors):
            log.warning("pass failed: %s", error)
            self.metrics.pass_failures.labels(manufacturer=error.manufacturer).inc()
        self.detected = keep_failed(found.items, self.published, failed)
        now = anyio.current_time()
        expected = health.expected_ids([*self.published, *self.detected])
        self._transitions(self.book.observe(expected, sampled.items, failed, now))
        self._refresh(now)
        self.samples = health.overlay_samples(self.book, sampled.items)
        self.last_samples = events.SamplesEvent(
            node=self.settings.node_name,
            period_s=self.settings.monitor_period_s,
            samples=tuple(self.samples),
        )
        self.publish(self.last_samples)
        self.passes += 1

    async def _timed(self, call: Callable[[], T], histogram: Histogram) -> T:
        """Run one pass in the worker thread (one at a time), timing it into ``histogram``."""
        started = time.perf_counter()
        try:
            return await anyio.to_thread.run_sync(call, limiter=self._limiter)
        finally:
            histogram.observe(time.perf_counter() - started)

    def on_xid(self, accelerator_id: str, xid: int) -> None:
        """An XID from the watcher: decide, and on a transition publish and push at once."""
        now = anyio.current_time()
        self.last_xids[accelerator_id] = xid  # every XID, ignored ones too, as DCGM reports
        change = self.book.xid(accelerator_id, xid, now)
        if change is None:
            log.info("XID %d on %s: no health change", xid, accelerator_id)
            return
        self._transitions([change])
        self._refresh(now)

    def _transitions(self, changes: Sequence[health.Transition]) -> None:
        for change in changes:
            level = logging.INFO if change.healthy else logging.WARNING
            log.log(level, "%s is %s: %s", change.accelerator_id,
                    "Healthy" if change.healthy else "Unhealthy", change.message)  # fmt: skip
            self.publish(change.event(self.settings.node_name))

    def _refresh(self, now: float) -> None:
        """Recompute the published groups; push them to kubelet; publish on change or resync."""
        groups = health.overlay(self.book, self.detected, self.published)
        changed = groups != self.published
        self.published = groups
        self.samples = health.overlay_samples(self.book, self.samples)  # what /metrics shows
        if self.plugins is not None:
            self.plugins.update(groups)
        due = (
            self._devices_sent_at is None
            or now - self._devices_sent_at >= self.settings.resync_period_s
        )
        if changed or due:
            self.publish(events.DevicesEvent(node=self.settings.node_name, groups=tuple(groups)))
            self._devices_sent_at = now


def keep_failed(
    detected: Sequence[devices.DeviceGroup],
    previous: Sequence[devices.DeviceGroup],
    failed: set[str],
) -> list[devices.DeviceGroup]:
    """``detected`` plus the previous groups of manufacturers whose pass failed this time.

    A failed pass says nothing about the cards, so they are neither dropped nor changed.
    """
    if not failed:
        return list(detected)
    kept = [g for g in previous if g.manufacturer in failed]
    return devices.canonical_groups([*[g for g in detected if g.manufacturer not in failed], *kept])

"""``dm serve``: the per-node device agent's composition root.

The process is one task group (:func:`run`); each long-lived part is a child that signals
readiness with ``tg.start``, and shutdown is the same tree unwound (every cleanup shielded and
time-bounded by its owner):

1. the bus publisher, created before any connection: its outbox keeps the latest state (and a
   bounded number of samples) until NATS answers;
2. the backends (real NVML/sysfs, or a simulated tree and NVML), open for the whole process;
3. the bus link (not awaited: with NATS unreachable the agent still serves kubelet and metrics;
   :func:`bus.publishing.link` attaches the publisher, the access reviewer and the follower of
   this node's pending containers (:mod:`agent.deviceplugin.kvpending`) whenever the connection comes up);
4. HTTPS (``/metrics``, ``/readyz``, ``/livez``, ``/monitor/snapshot``); with
   ``--metrics-auth=review``, the non-probe routes ask the worker (503 while they cannot);
   ``/livez`` fails once the agent has been off the bus past the bound (:class:`Probes`);
5. the device plugins (bound and registered on the first :meth:`Plugins.update`), their ledger
   rebuilt from the bus's retained history, or from the copy kept on the node
   (:mod:`agent.serve.holdingsfile`) when the bus cannot be read at start;
6. the observer (:mod:`agent.serve.observing`): one pass every monitor period (detection, sampling,
   health re-check), started with the plugins it pushes to, once the first pass is published;
7. the XID watcher (NVIDIA only) and the heartbeat.

Objects are built in dependency order: the metrics the observer writes exist before it, the
scrape-time view that reads it is registered after it (:func:`agent.serve.metrics.register_view`).

Every decision is made synchronously by :class:`agent.serve.health.HealthBook` and
:func:`agent.serve.health.overlay`; this module only moves data between the threads, the bus, kubelet
and the scrape endpoint. All mutable state lives on the event loop thread.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.abc
import anyio.to_thread
from prometheus_client import CollectorRegistry

from agent.deviceplugin import kvpending, partitioning
from agent.deviceplugin.controls import driver_controls
from agent.deviceplugin.injecting import DriverControl
from agent.deviceplugin.running import Plugins, device_plugins
from agent.devices import detection, nvidia, sources
from agent.errors import StartFailed
from agent.serve import holdingsfile, metrics, restoring, watching
from agent.serve.observing import Observer
from agent.serve.settings import ServeSettings
from bus import events
from bus.accessreviews import BusReviewer
from bus.errors import BusError
from bus.metrics import BusMetrics
from bus.presence import Presence
from bus.publishing import Publisher, link, publisher
from kit import serving

log = logging.getLogger(__name__)


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
        presence = Presence(since=anyio.current_time())
        tg.start_soon(
            functools.partial(
                link, pub, settings.bus, name=f"agent/{settings.node_name}",
                also=(reviewer.attach, kvpending.attach(pending, settings.node_name)),
                presence=presence,
            ),
            name="bus-link",
        )  # fmt: skip
        probes = Probes(observer, presence, settings.bus.max_offline_s)
        server = await tg.start(serve_https, settings, registry, probes, reviewer, name="https")
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


@dataclass(frozen=True)
class Probes:
    """What kubelet's probes are told.

    ``/readyz``: a pass is published and kubelet holds every plugin: what the node needs from
    this agent, which serves kubelet with or without the bus (its events wait in the outbox).
    ``/livez``: the agent has not been off the bus for longer than ``max_offline_s`` (the bus
    settings' documented bound): the connection is replaced for ever after any loss, so one
    still off by then is stuck in a way only a restart may cure (kubelet's, after its
    failure threshold).
    """

    observer: Observer
    presence: Presence
    max_offline_s: float

    def ready(self) -> bool:
        return self.observer.is_ready()

    def live(self) -> bool:
        return self.presence.alive(anyio.current_time(), self.max_offline_s)


async def serve_https(
    settings: ServeSettings,
    registry: CollectorRegistry,
    probes: Probes,
    reviewer: BusReviewer,
    *,
    task_status: anyio.abc.TaskStatus[serving.Server],
) -> None:
    async with (
        serving.https_server(
            settings.https,
            registry=registry,
            ready=probes.ready,
            live=probes.live,
            routes={"/monitor/snapshot": probes.observer.snapshot},
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
    kept = holdingsfile.LedgerFile(settings.ledger_path, settings.node_name, retained)
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

"""The ``worker`` process: the composition root (the service :func:`run`; its settings are in
:mod:`controlplane.worker.settings`).

One anyio task group: the bus subscription (retained state first, then live events) feeding the
ledger in every replica; the reconcilers, resync and CRD repair only in the leader; the HTTPS
endpoint (:mod:`controlplane.worker.endpoint`: ``/metrics``, probes, the Pod admission webhooks, which
answer from the ledger) throughout. With an API, every replica also answers the agents' access
reviews on the bus (TokenReview and SubjectAccessReview on their behalf:
:mod:`controlplane.access.reviewer`) and uses the same reviewer for its own ``/metrics``. With a
reachable Kubernetes API the sink is the API (CRDs and webhook configurations applied at start-up,
Lease-based election); without one (``standalone``, or ``--kubeconfig=none``) the same reconcilers
keep their ledger in the bus's KV bucket, and the webhooks are served all the same.

Samples are never written to the API: they stay on the bus (retained) and in metrics.

After every reconnect the worker re-ensures the streams and buckets it needs (the server may have
restarted without its store) and, as leader, writes again on the next reconcile whatever lives only
in the bus: the agents' records and, with the KV sink, the ledger itself. The subscription reads
the retained state again by itself (:mod:`bus.subscribing`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import anyio
import msgspec
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from bus import callout, codec, connection, events, kv, state, subscribing
from bus.errors import BusError, NotConnected
from bus.metrics import BusMetrics
from controlplane import applications, errors
from controlplane.access import bootstrap, busauth
from controlplane.chain.checking import AdmissionChecker
from controlplane.chain.reconciler import ChainReconciler
from controlplane.chain.settings import ChainSettings
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.clustersettings.source import KvBackend, SecretBackend, SettingsSource
from controlplane.delivery.metering import BindingMeter, Quotas
from controlplane.delivery.prefetching import Prefetcher
from controlplane.extension import registration
from controlplane.extension.workergroup import group as workergroup
from controlplane.k8s import client
from controlplane.k8s.informing import Informer
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling import hubresolver
from controlplane.reconciling.annotating import PodAnnotator
from controlplane.reconciling.artifacting import ArtifactReconciler, Inputs
from controlplane.reconciling.hubresolver import Resolver
from controlplane.reconciling.nodes import NodeReconciler
from controlplane.reconciling.nodestates import Ledger
from controlplane.reconciling.pending import PendingPublisher
from controlplane.reconciling.podevents import PodEventer
from controlplane.reconciling.processing import LabelsDue, Listeners, Processor
from controlplane.reconciling.queueing import AsyncKeyQueue
from controlplane.reconciling.sinks import KubeSink, KvSink, Sink
from controlplane.resources import NODES
from controlplane.schema import crds
from controlplane.stores.modelstores import ModelStores
from controlplane.worker import endpoint, leading
from controlplane.worker.settings import WorkerSettings
from kit import heap
from kit.backoff import Backoff
from kit.latest import Latest
from kit.tasks import start_forever

__all__ = ["Worker", "WorkerSettings", "run"]

log = logging.getLogger(__name__)

METER_PERIOD_S = 15.0
"""At most this long between two counts of the ModelStoreBindings' usage (the agents' quotas)."""


@dataclass
class Worker:
    """What a started worker exposes (to ``tg.start`` callers and tests)."""

    url: str
    metrics: WorkerMetrics
    processor: Processor
    artifacts: ArtifactReconciler
    leading: bool = False
    chain: ChainReconciler | None = None
    """The scheduling chain (with a Kubernetes API only)."""
    settings: SettingsSource | None = None
    """The cluster's Settings, swapped on change (reconcilers and webhooks read ``values``)."""
    samples: registration.LatestSamples = field(default_factory=registration.LatestSamples)
    """Each node's latest utilization sample (the extension API's ``nodeutilizations``)."""
    group: workergroup.WorkerGroup | None = None
    """``worker.gpustack.ai/v1``: its mirrors and their feeds (run in every replica)."""


@asynccontextmanager
async def _sink(
    settings: WorkerSettings, conn: connection.Connection, metrics: WorkerMetrics
) -> AsyncIterator[tuple[Sink, client.KubeClient | None]]:
    if settings.kube is None:
        bucket = await kv.open_bucket(
            conn, kv.LEDGER_BUCKET, replicas=settings.bus.state_replicas,
            observe=metrics.observe_request,
        )  # fmt: skip
        yield KvSink(bucket), None
        return
    async with client.open_client(settings.kube, observe=metrics.observe_request) as api:
        await crds.ensure(api)
        yield KubeSink(api), api


async def _settings_source(
    settings: WorkerSettings,
    conn: connection.Connection,
    api: client.KubeClient | None,
    pins: Latest[str, tuple[str, ...]],
) -> tuple[SettingsSource, ModelStores]:
    """The Settings, seeded or backfilled (every replica): the Secret, else the bus KV; and the
    ModelStores, which make the NodeModelStore specs from them and the prefetches' ``pins``."""
    if api is None:
        bucket = await kv.open_bucket(conn, kv.LEDGER_BUCKET, replicas=settings.bus.state_replicas)
        backend: KvBackend | SecretBackend = KvBackend(bucket, settings.namespace)
    else:
        backend = SecretBackend(api, settings.namespace)
    source = SettingsSource(backend, settings.settings_seed, period_s=settings.settings_period_s)
    await source.prepare()
    return source, ModelStores(lambda: source.values, pins.get)


async def _bootstrap(settings: WorkerSettings) -> WorkerSettings:
    """With ``--nats-auth-secret``: the bus's keys from that Secret, generated first when it is
    absent (before the bus is reached: the NATS servers wait for the same Secret)."""
    name = settings.nats_auth_secret
    if name is None or settings.kube is None or settings.bus_auth is None:
        return settings
    async with client.open_client(settings.kube) as api:
        keys = await bootstrap.ensure_bus_auth(api, settings.namespace, name)
    return msgspec.structs.replace(
        settings,
        bus=msgspec.structs.replace(settings.bus, password=keys.worker_password),
        bus_auth=msgspec.structs.replace(settings.bus_auth, issuer_seed=keys.issuer_seed),
    )


@asynccontextmanager
async def _callout(
    settings: WorkerSettings,
    conn: connection.Connection,
    api: client.KubeClient | None,
    verify: callout.Verifier | None,
) -> AsyncIterator[None]:
    """Serve the bus's auth callout while inside, when ``settings.bus_auth`` names the issuer:
    deciding with ``verify`` when given (``standalone``), else by TokenReview."""
    auth = settings.bus_auth
    if auth is None:
        yield
        return
    issuer = busauth.issuer(auth)
    if verify is None:
        if api is None:
            raise BusError("the bus's auth callout verifies agents through the Kubernetes API")
        verify = busauth.review_verifier(api, auth)
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: callout.serve(
            conn, issuer=issuer, verify=verify, task_status=task_status
        ))  # fmt: skip
        log.info("serving the bus's auth callout (issuer %s)", issuer.public_key)
        yield
        tg.cancel_scope.cancel()


@dataclass
class _Parts:
    """What one worker process is made of (built by :func:`_assemble`)."""

    conn: connection.Connection
    api: client.KubeClient | None
    sink: Sink
    agents: kv.Bucket
    ledger: Ledger
    annotator: PodAnnotator
    eventer: PodEventer
    stores: ModelStores
    sub: subscribing.Subscription
    worker: Worker
    nodes: Informer | None
    """The one Node watch (with an API): the processor's gone/parked nodes, the chain's cache."""
    meter: BindingMeter
    prefetcher: Prefetcher


async def _assemble(
    stack: AsyncExitStack,
    settings: WorkerSettings,
    registry: CollectorRegistry,
    resolver: Resolver | None,
    verify: callout.Verifier | None,
) -> _Parts:
    """Connect, open the buckets and the API, build the reconcilers, start serving HTTPS."""
    metrics = WorkerMetrics(registry)
    conn, agents = await _connect(stack, settings, metrics)
    sink, api = await stack.enter_async_context(_sink(settings, conn, metrics))
    await stack.enter_async_context(_callout(settings, conn, api, verify))
    if resolver is None:
        resolver = await stack.enter_async_context(hubresolver.hub_resolver(settings.hub_endpoint))
    base = await _footing(settings, conn, api, sink, metrics, agents)
    reconcilers = await _reconcilers(stack, settings, base, resolver)
    delivery = _delivery(base, reconcilers)
    sub, worker = await _serve(stack, settings, registry, base, reconcilers, delivery.processor)
    return _Parts(
        conn=conn, api=api, sink=sink, agents=agents, ledger=base.ledger,
        annotator=delivery.annotator, eventer=delivery.eventer, stores=base.stores, sub=sub,
        worker=worker, nodes=base.nodes, meter=delivery.meter, prefetcher=delivery.prefetcher,
    )  # fmt: skip


async def _connect(
    stack: AsyncExitStack, settings: WorkerSettings, metrics: WorkerMetrics
) -> tuple[connection.Connection, kv.Bucket]:
    """The bus connection, its streams ensured, and the agents' bucket (the API's configuration
    checked first)."""
    if settings.kube is not None:  # told now, not after the bus's retries (no server: for ever)
        await client.check_configuration(settings.kube)
    conn = await stack.enter_async_context(connection.connect(settings.bus, name="worker"))
    await state.ensure_streams(conn, settings.bus)
    agents = await kv.open_bucket(
        conn, kv.AGENTS_BUCKET, replicas=settings.bus.state_replicas,
        observe=metrics.observe_request,
    )  # fmt: skip
    return conn, agents


@dataclass(frozen=True)
class _Footing:
    """What the reconcilers stand on: the bus, the sink and API, the cluster's Settings, the
    ledger and the Node watch."""

    conn: connection.Connection
    sink: Sink
    api: client.KubeClient | None
    metrics: WorkerMetrics
    agents: kv.Bucket
    pins: Latest[str, tuple[str, ...]]
    """The prefetcher's, read by the stores."""
    quotas: Latest[str, Quotas]
    """The meter's, read by the artifact reconciler."""
    source: SettingsSource
    stores: ModelStores
    ledger: Ledger
    nodes: Informer | None


async def _footing(
    settings: WorkerSettings,
    conn: connection.Connection,
    api: client.KubeClient | None,
    sink: Sink,
    metrics: WorkerMetrics,
    agents: kv.Bucket,
) -> _Footing:
    """The shared state the reconcilers read: the Settings and stores, the ledger, the Nodes."""
    pins: Latest[str, tuple[str, ...]] = Latest(())  # the prefetcher's, read by the stores
    quotas: Latest[str, Quotas] = Latest(())  # the meter's, read by the artifact reconciler
    source, stores = await _settings_source(settings, conn, api, pins)
    ledger = Ledger(max_nodes=settings.max_nodes)
    nodes = None
    if api is not None:
        resync_s = settings.kube.relist_s if settings.kube is not None else 0.0
        nodes = Informer(api, NODES, resync_s=resync_s)
    return _Footing(
        conn=conn, sink=sink, api=api, metrics=metrics, agents=agents, pins=pins, quotas=quotas,
        source=source, stores=stores, ledger=ledger, nodes=nodes,
    )  # fmt: skip


@dataclass(frozen=True)
class _Reconcilers:
    """The reconcilers and the queue of nodes due a reconcile."""

    queue: AsyncKeyQueue[str]
    chain: ChainReconciler | None
    nodes: NodeReconciler
    artifacts: ArtifactReconciler


async def _reconcilers(
    stack: AsyncExitStack, settings: WorkerSettings, base: _Footing, resolver: Resolver
) -> _Reconcilers:
    """The chain (with an API), the node reconciler, and the artifact reconciler with both hubs'
    resolvers (ModelScope's opened here, following the Settings' endpoint)."""
    ledger, sink, source = base.ledger, base.sink, base.source
    metrics, agents = base.metrics, base.agents
    queue: AsyncKeyQueue[str] = AsyncKeyQueue(settings.max_nodes)
    chain = _chain(
        base.api, base.nodes, ledger, settings, metrics, source, LabelsDue(queue, ledger)
    )
    reconciler = NodeReconciler(
        ledger=ledger, sink=sink, metrics=metrics, agents=agents, store_specs=base.stores,
        nodes=base.nodes, labeller=chain,
    )  # fmt: skip
    modelscope = await stack.enter_async_context(
        hubresolver.modelscope_resolver(lambda: source.values.model_artifact_modelscope_endpoint)
    )
    artifacts = ArtifactReconciler(
        sink=sink, resolvers={"huggingface": resolver, "modelscope": modelscope}, ledger=ledger,
        metrics=metrics, agents=agents,
        retry_base_s=settings.artifact_retry_base_s, retry_cap_s=settings.artifact_retry_cap_s,
        inputs=Inputs(
            quotas=base.quotas.get,
            revalidate_s=lambda: source.values.model_artifact_revalidate_interval,
        ),
    )  # fmt: skip
    return _Reconcilers(queue=queue, chain=chain, nodes=reconciler, artifacts=artifacts)


@dataclass(frozen=True)
class _Delivery:
    """The processor, its listeners and the loops that feed it: meter and prefetcher."""

    meter: BindingMeter
    annotator: PodAnnotator
    eventer: PodEventer
    processor: Processor
    prefetcher: Prefetcher


def _delivery(base: _Footing, reconcilers: _Reconcilers) -> _Delivery:
    """The processor with its listeners, told of Node changes; the meter and the prefetcher."""
    ledger, source, artifacts = base.ledger, base.source, reconcilers.artifacts
    meter = BindingMeter(ledger, quotas=base.quotas, on_quotas=artifacts.quotas_changed)
    annotator = PodAnnotator(ledger)
    eventer = PodEventer()
    processor = Processor(
        ledger=ledger, reconciler=reconcilers.nodes, sink=base.sink, metrics=base.metrics,
        queue=reconcilers.queue,
        listeners=Listeners(allocations=annotator, models_events=eventer, digests=artifacts,
                            states=reconcilers.chain, known_nodes=base.nodes),
    )  # fmt: skip
    if base.nodes is not None:
        base.nodes.listen(processor.node_changed)
    prefetcher = Prefetcher(
        ledger, pins=base.pins, image=lambda: source.values.model_prefetch_warmup_image,
        on_pins=processor.refresh_node,
    )  # fmt: skip
    return _Delivery(
        meter=meter, annotator=annotator, eventer=eventer, processor=processor,
        prefetcher=prefetcher,
    )  # fmt: skip


async def _serve(
    stack: AsyncExitStack,
    settings: WorkerSettings,
    registry: CollectorRegistry,
    base: _Footing,
    reconcilers: _Reconcilers,
    processor: Processor,
) -> tuple[subscribing.Subscription, Worker]:
    """Subscribe to the bus, serve HTTPS (probes, webhooks, the extension API's group) and
    make the :class:`Worker` its owner reads."""
    sub = await stack.enter_async_context(subscribing.subscribe(
        base.conn, settings=settings.bus, metrics=BusMetrics(registry), include_state=True,
        memo_kinds=codec.REPEATED_KINDS,
    ))  # fmt: skip
    samples = registration.LatestSamples()
    group = _group(settings, base.api, base.ledger, base.stores)
    chain = reconcilers.chain
    server = await stack.enter_async_context(endpoint.serve(
        settings, base.conn, base.api, registry, base.ledger, source=base.source, chain=chain,
        samples=samples, group=group,
    ))  # fmt: skip
    worker = Worker(
        url=server.url, metrics=base.metrics, processor=processor,
        artifacts=reconcilers.artifacts, settings=base.source, chain=chain, samples=samples,
        group=group,
    )  # fmt: skip
    return sub, worker


async def _lead(settings: WorkerSettings, parts: _Parts) -> None:
    """What only the leader runs: watches, resyncs, the chain, the reconcile workers."""
    worker, api = parts.worker, parts.api
    processor, artifacts = worker.processor, worker.artifacts
    async with anyio.create_task_group() as tg:
        start_forever(tg, "node-resync", processor.resync_every, settings.resync_s)
        start_forever(tg, "artifact-resync", artifacts.resync_every, settings.resync_s)
        if api is not None:
            assert parts.nodes is not None  # made with the API client
            start_forever(tg, "crd-check", crds.keep_present, api, settings.crd_check_s)
            start_forever(tg, "node-watch", parts.nodes.run)
            start_forever(tg, "artifact-watch", artifacts.watch, api)
            start_forever(tg, "pod-watch", PendingPublisher(parts.agents).watch, api)
            _start_chain(tg, api, parts.ledger, worker.chain)
            start_forever(tg, "pod-annotations", parts.annotator.run, api)
            start_forever(tg, "pod-events", parts.eventer.run, api)
            start_forever(tg, "model-stores", parts.stores.run, api, settings.resync_s, parts.nodes)
            period = min(settings.resync_s, METER_PERIOD_S)
            start_forever(tg, "binding-meter", parts.meter.run, api, period, parts.nodes)
            start_forever(tg, "prefetches", parts.prefetcher.run, api, period, parts.nodes)
            tg.start_soon(_applications, api, settings, name="applications")
        start_forever(tg, "artifact-workers", artifacts.work, max(1, settings.concurrency // 4))
        await processor.work(settings.concurrency)


async def _applications(api: client.KubeClient, settings: WorkerSettings) -> None:
    """Install the bundled applications, prune the disabled ones (once per leadership)."""
    await applications.ensure(
        api, settings.applications, namespace=settings.namespace,
        mirror=settings.applications_mirror, pod=settings.pod_name,
        manufacturers=settings.manufacturers,
    )  # fmt: skip


async def run(
    settings: WorkerSettings,
    *,
    registry: CollectorRegistry | None = None,
    resolver: Resolver | None = None,
    verify: callout.Verifier | None = None,
    task_status: TaskStatus[Worker] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the worker until cancelled; ``task_status.started`` once it serves and ingests.

    ``resolver`` replaces the Hub client that resolves ModelArtifacts (tests, benchmarks);
    ``verify`` decides the bus's auth callout instead of TokenReview (``standalone``).
    """
    registry = registry or CollectorRegistry(auto_describe=True)
    settings = await _bootstrap(settings)
    async with AsyncExitStack() as stack:
        parts = await _assemble(stack, settings, registry, resolver, verify)
        worker, api, conn = parts.worker, parts.api, parts.conn

        def on_change(now_leading: bool) -> None:
            worker.leading = now_leading
            worker.metrics.leader.set(1 if now_leading else 0)

        async def reconnected() -> None:
            await _rebuild_after_reconnect(conn, settings, worker, parts.sink)

        async def lead() -> None:
            await _lead(settings, parts)

        async with anyio.create_task_group() as tg:
            start_forever(
                tg, "ingest", _ingest, parts.sub, worker.processor, worker.samples,
                settings.manufacturers,
            )  # fmt: skip
            start_forever(tg, "bus-reconnects", conn.every_reconnect, reconnected)
            start_forever(tg, "settings", _keep_settings, worker, settings)
            if worker.group is not None:
                start_forever(tg, "worker-group", worker.group.run)
            tg.start_soon(heap.pace_collections, name="heap")  # see kit.heap: p99 at scale
            if api is not None and settings.leader is not None:
                tg.start_soon(_elected, api, settings.leader, settings.identity, lead, on_change,
                              name="election")  # fmt: skip
            else:
                on_change(True)
                tg.start_soon(lead, name="leader")
            ledger_in = "the bus KV" if api is None else "Kubernetes"
            log.info("worker ready (HTTPS %s, ledger in %s)", worker.url, ledger_in)
            task_status.started(worker)


def _group(
    settings: WorkerSettings, api: client.KubeClient | None, ledger: Ledger, stores: ModelStores
) -> workergroup.WorkerGroup:
    """``worker.gpustack.ai/v1``: fed by informers with an API, else by the bus ledger."""

    def downloads() -> list[tuple[str, tuple[events.ModelState, ...] | None]]:
        return [(n, s.models) for n in ledger.nodes() if (s := ledger.get(n)) is not None]

    return workergroup.build(
        api=api, ledger=ledger, downloads=downloads,
        relist_s=settings.kube.relist_s if settings.kube is not None else 0.0,
        spec_for=lambda _node: stores.spec_for({}),
    )  # fmt: skip


def _chain(
    api: client.KubeClient | None,
    nodes: Informer | None,
    ledger: Ledger,
    settings: WorkerSettings,
    metrics: WorkerMetrics,
    source: SettingsSource,
    labels_due: LabelsDue,
) -> ChainReconciler | None:
    if api is None:
        return None
    assert nodes is not None  # made with the API client
    chain = _chain_settings(settings, source)
    return ChainReconciler(
        api=api, ledger=ledger, nodes=nodes, settings=chain, metrics=metrics,
        labels_due=labels_due,
    )  # fmt: skip


def _chain_settings(settings: WorkerSettings, source: SettingsSource) -> ChainSettings:
    """The chain's knobs: the Settings (fit affinity, derived InstanceTypes, manual node
    management) and ``--disable-applications`` (whether Kueue's objects are managed)."""
    fields = settingscatalog.chain_fields(
        source.values, manage_kueue="kueue" in settings.applications
    )
    return msgspec.structs.replace(settings.chain, **fields)


def _start_chain(
    tg: anyio.abc.TaskGroup, api: client.KubeClient, ledger: Ledger, chain: ChainReconciler | None
) -> None:
    """The scheduling chain's reconciler and its admission check (leader, with an API)."""
    if chain is None:
        return
    start_forever(tg, "scheduling-chain", chain.run)
    start_forever(tg, "admission-check", AdmissionChecker(api=api, ledger=ledger, chain=chain).run)


async def _elected(
    api: client.KubeClient,
    leader: leading.LeaderSettings,
    identity: str,
    lead: Callable[[], Awaitable[None]],
    on_change: Callable[[bool], None],
) -> None:
    await leading.run_elected(api, leader, identity, lead, on_change=on_change)


async def _keep_settings(worker: Worker, settings: WorkerSettings) -> None:
    """Re-read the settings (every replica); as leader, queue every node when they change, so
    the NodeModelStore specs follow within the re-read period, not at the next resync."""
    source = worker.settings
    assert source is not None
    async with anyio.create_task_group() as tg, source.changes() as changes:
        tg.start_soon(source.run, name="settings-refresh")
        async for _ in changes:
            if worker.chain is not None:  # every replica answers the Workload webhook
                worker.chain.retune(_chain_settings(settings, source))
            if not worker.leading:
                continue
            try:
                await worker.processor.resync()
            except (errors.ApiError, BusError) as e:
                log.warning("settings changed; queueing the nodes failed (resync follows): %s", e)


async def _ingest(
    sub: subscribing.Subscription,
    processor: Processor,
    samples: registration.LatestSamples,
    manufacturers: tuple[str, ...],
) -> None:
    async for event in sub:
        samples.record(event)
        processor.ingest(_managed(event, manufacturers))


def _managed(event: events.Event, manufacturers: tuple[str, ...]) -> events.Event:
    """The event with only the device groups of ``--manufacturer`` (all when empty): the worker
    manages Devices groups, node labels and capacity for those manufacturers only."""
    if not manufacturers or not isinstance(event, events.DevicesEvent):
        return event
    groups = tuple(g for g in event.groups if g.manufacturer in manufacturers)
    return (
        event if len(groups) == len(event.groups) else msgspec.structs.replace(event, groups=groups)
    )


_ENSURE_CAP_S = 5.0
"""The longest wait between two tries of re-ensuring the bus state after a reconnect."""


async def _ensure_bus(conn: connection.Connection, settings: WorkerSettings) -> bool:
    """Re-ensure the streams and buckets, retrying until the server answers; False when the
    connection dropped again meanwhile (the next reconnect tries again)."""
    buckets = (
        [kv.AGENTS_BUCKET] if settings.kube is not None else [kv.AGENTS_BUCKET, kv.LEDGER_BUCKET]
    )
    schedule = Backoff(min(settings.bus.reconnect_wait_s, _ENSURE_CAP_S), _ENSURE_CAP_S)
    for attempt in itertools.count():
        try:
            await state.ensure_streams(conn, settings.bus)
            for bucket in buckets:
                await kv.open_bucket(conn, bucket, replicas=settings.bus.state_replicas)
            return True
        except NotConnected:
            return False
        except BusError as e:  # JetStream still starting after a server restart
            log.warning("cannot re-ensure the bus state after a reconnect, retrying: %s", e)
            await schedule.wait(attempt)  # any attempt number: no float overflow
    raise AssertionError("unreachable")  # pragma: no cover


async def _rebuild_after_reconnect(
    conn: connection.Connection, settings: WorkerSettings, worker: Worker, sink: Sink
) -> None:
    """Make the bus whole again after a reconnect: it may be a server that lost its store.

    What the worker remembers having written to the bus is forgotten, so the next reconcile of
    every node and artifact writes it again when it is missing (and nothing when it is not).
    """
    if not await _ensure_bus(conn, settings):
        return
    worker.processor.reconciler.forget_pushed()
    worker.artifacts.forget_pushed()
    if isinstance(sink, KvSink):  # the ledger itself lives in the bus
        sink.forget()
        worker.processor.reconciler.forget_cache()
    if worker.leading:
        try:
            await worker.processor.resync()
            await worker.artifacts.resync()
        except (errors.ApiError, BusError) as e:
            log.warning("resync after a reconnect failed (the periodic one follows): %s", e)

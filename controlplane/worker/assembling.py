"""How one worker process is put together: :func:`assemble` connects to the bus, opens the
sink (the Kubernetes API, else the bus's KV bucket) and the Settings, builds the reconcilers, the
processor with its listeners and the delivery loops, subscribes and starts serving HTTPS, and
returns the :class:`Parts` that :mod:`controlplane.worker.running` runs.

Construction only: nothing here runs a loop of its own. Every long-lived part is entered on the
caller's :class:`~contextlib.AsyncExitStack`, so leaving the stack closes them in reverse order
of their making; the order of construction is the order of dependence (the bus before the sink,
the Settings before the stores, the reconcilers before the processor that feeds them).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import anyio
import msgspec
from prometheus_client import CollectorRegistry

from bus import callout, codec, connection, events, kv, state, subscribing
from bus.errors import BusError
from bus.metrics import BusMetrics
from controlplane.access import busauth
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
from controlplane.reconciling.podevents import PodEventer
from controlplane.reconciling.processing import LabelsDue, Listeners, Processor
from controlplane.reconciling.queueing import AsyncKeyQueue
from controlplane.reconciling.sinks import KubeSink, KvSink, Sink
from controlplane.resources import NODES
from controlplane.schema import crds
from controlplane.stores.modelstores import ModelStores
from controlplane.worker import endpoint
from controlplane.worker.settings import WorkerSettings
from kit.latest import Latest

__all__ = ["Parts", "Worker", "assemble", "chain_settings"]

log = logging.getLogger(__name__)


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
class Parts:
    """What one worker process is made of (built by :func:`assemble`)."""

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


async def assemble(
    stack: AsyncExitStack,
    settings: WorkerSettings,
    registry: CollectorRegistry,
    resolver: Resolver | None,
    verify: callout.Verifier | None,
) -> Parts:
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
    return Parts(
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
    chain = chain_settings(settings, source)
    return ChainReconciler(
        api=api, ledger=ledger, nodes=nodes, settings=chain, metrics=metrics,
        labels_due=labels_due,
    )  # fmt: skip


def chain_settings(settings: WorkerSettings, source: SettingsSource) -> ChainSettings:
    """The chain's knobs: the Settings (fit affinity, derived InstanceTypes, manual node
    management) and ``--disable-applications`` (whether Kueue's objects are managed)."""
    fields = settingscatalog.chain_fields(
        source.values, manage_kueue="kueue" in settings.applications
    )
    return msgspec.structs.replace(settings.chain, **fields)

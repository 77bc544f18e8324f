"""The ``worker`` process: the composition root (command target :func:`worker_command`).

One anyio task group: the bus subscription (retained state first, then live events) feeding the
ledger in every replica; the reconcilers, resync and CRD repair only in the leader; the HTTPS
endpoint (``/metrics``, ``/readyz``, ``/livez`` and the Pod admission webhooks, which answer from
the ledger) throughout. With a reachable Kubernetes API the sink is the API (CRDs and webhook
configurations applied at start-up, Lease-based election); without one (``standalone``, or
``--kubeconfig=none``) the same reconcilers keep their ledger in the bus's KV bucket, and the
webhooks are served all the same.

Samples are never written to the API: they stay on the bus (retained) and in metrics.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from bus import connection, kv, state, subscribing
from bus.metrics import BusMetrics
from controlplane import crds, leading, resolving
from controlplane.admission import certificates, webhooks
from controlplane.admission.cards import LedgerCatalog
from controlplane.k8s import client
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling.artifacting import ArtifactReconciler
from controlplane.reconciling.ledger import Ledger
from controlplane.reconciling.nodes import NodeReconciler
from controlplane.reconciling.processing import Processor
from controlplane.resolving import Resolver
from controlplane.settings import WorkerSettings
from controlplane.sinks import KubeSink, KvSink, Sink
from kit import serving
from kit.tasks import start_forever

__all__ = ["Worker", "WorkerSettings", "run"]

log = logging.getLogger(__name__)


@dataclass
class Worker:
    """What a started worker exposes (to ``tg.start`` callers and tests)."""

    url: str
    metrics: WorkerMetrics
    processor: Processor
    artifacts: ArtifactReconciler
    leading: bool = False


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


async def run(
    settings: WorkerSettings,
    *,
    registry: CollectorRegistry | None = None,
    resolver: Resolver | None = None,
    task_status: TaskStatus[Worker] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the worker until cancelled; ``task_status.started`` once it serves and ingests.

    ``resolver`` replaces the Hub client that resolves ModelArtifacts (tests, benchmarks).
    """
    registry = registry or CollectorRegistry(auto_describe=True)
    metrics = WorkerMetrics(registry)
    bus_metrics = BusMetrics(registry)
    async with AsyncExitStack() as stack:
        conn = await stack.enter_async_context(connection.connect(settings.bus, name="worker"))
        await state.ensure_streams(conn, settings.bus)
        agents = await kv.open_bucket(
            conn, kv.AGENTS_BUCKET, replicas=settings.bus.state_replicas,
            observe=metrics.observe_request,
        )  # fmt: skip
        sink, api = await stack.enter_async_context(_sink(settings, conn, metrics))
        if resolver is None:
            resolver = await stack.enter_async_context(
                resolving.hub_resolver(settings.hub_endpoint)
            )
        ledger = Ledger(max_nodes=settings.max_nodes)
        reconciler = NodeReconciler(ledger=ledger, sink=sink, metrics=metrics, agents=agents)
        artifacts = ArtifactReconciler(
            sink=sink, resolver=resolver, ledger=ledger, metrics=metrics, agents=agents,
            retry_base_s=settings.artifact_retry_base_s, retry_cap_s=settings.artifact_retry_cap_s,
        )  # fmt: skip
        processor = Processor(
            ledger=ledger, reconciler=reconciler, sink=sink, metrics=metrics,
            max_keys=settings.max_nodes, on_models=artifacts.models_changed,
        )  # fmt: skip
        sub = await stack.enter_async_context(
            subscribing.subscribe(
                conn, settings=settings.bus, metrics=bus_metrics, include_state=True
            )
        )
        worker = Worker(url="", metrics=metrics, processor=processor, artifacts=artifacts)
        server = await stack.enter_async_context(
            _serve(settings, api, registry, lambda: conn.is_connected, LedgerCatalog(ledger))
        )
        worker.url = server.url

        async def lead() -> None:
            async with anyio.create_task_group() as tg:
                start_forever(tg, "node-resync", processor.resync_every, settings.resync_s)
                start_forever(tg, "artifact-resync", artifacts.resync_every, settings.resync_s)
                if api is not None:
                    start_forever(tg, "crd-check", crds.keep_present, api, settings.crd_check_s)
                    start_forever(tg, "node-watch", processor.watch_nodes, api)
                    start_forever(tg, "artifact-watch", artifacts.watch, api)
                start_forever(
                    tg, "artifact-workers", artifacts.work, max(1, settings.concurrency // 4)
                )
                await processor.work(settings.concurrency)

        def on_change(now_leading: bool) -> None:
            worker.leading = now_leading
            metrics.leader.set(1 if now_leading else 0)

        async with anyio.create_task_group() as tg:
            start_forever(tg, "ingest", _ingest, sub, processor)
            if api is not None and settings.leader_election:
                tg.start_soon(_elected, api, settings, lead, on_change, name="election")
            else:
                on_change(True)
                tg.start_soon(lead, name="leader")
            ledger_in = "the bus KV" if api is None else "Kubernetes"
            log.info("worker ready (HTTPS %s, ledger in %s)", worker.url, ledger_in)
            task_status.started(worker)


@asynccontextmanager
async def _serve(
    settings: WorkerSettings,
    api: client.KubeClient | None,
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    catalog: LedgerCatalog,
) -> AsyncIterator[serving.Server]:
    """The HTTPS endpoint with the Pod webhooks. With a cluster, it serves a certificate the
    API server can verify, and the configurations naming its CA are applied once it listens:
    the API server is never sent to an endpoint that is not up."""
    posts = webhooks.posts(catalog)
    if api is None or settings.webhooks.service is None:
        async with serving.https_server(
            settings.https, registry=registry, ready=ready, posts=posts
        ) as server:
            yield server
        return
    async with AsyncExitStack() as stack:
        async with certificates.serving_identity(api, settings.https, settings.webhooks) as ident:
            server = await stack.enter_async_context(
                serving.https_server(ident.https, registry=registry, ready=ready, posts=posts)
            )
        await webhooks.ensure(api, settings.webhooks, ident.ca_bundle)
        yield server


async def _elected(
    api: client.KubeClient,
    settings: WorkerSettings,
    lead: Callable[[], Awaitable[None]],
    on_change: Callable[[bool], None],
) -> None:
    await leading.run_elected(api, settings.leader, settings.identity, lead, on_change=on_change)


async def _ingest(sub: subscribing.Subscription, processor: Processor) -> None:
    async for event in sub:
        processor.ingest(event)

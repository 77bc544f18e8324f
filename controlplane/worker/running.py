"""The ``worker`` process: the composition root (the service :func:`run`; its settings are in
:mod:`controlplane.worker.settings`, how its parts are built in :mod:`controlplane.worker.assembling`).

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
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import anyio
import msgspec
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from bus import callout, connection, events, kv, state, subscribing
from bus.errors import BusError, NotConnected
from controlplane import applications, errors
from controlplane.access import bootstrap
from controlplane.chain.checking import AdmissionChecker
from controlplane.chain.reconciler import ChainReconciler
from controlplane.extension import registration
from controlplane.k8s import client
from controlplane.reconciling.hubresolver import Resolver
from controlplane.reconciling.nodestates import Ledger
from controlplane.reconciling.pending import PendingPublisher
from controlplane.reconciling.processing import Processor
from controlplane.reconciling.sinks import KvSink, Sink
from controlplane.schema import crds
from controlplane.worker import leading
from controlplane.worker.assembling import Parts, Worker, assemble, chain_settings
from controlplane.worker.settings import WorkerSettings
from kit import heap
from kit.backoff import Backoff
from kit.tasks import start_forever

__all__ = ["Worker", "WorkerSettings", "run"]

log = logging.getLogger(__name__)

METER_PERIOD_S = 15.0
"""At most this long between two counts of the ModelStoreBindings' usage (the agents' quotas)."""


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


async def _lead(settings: WorkerSettings, parts: Parts) -> None:
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
        parts = await assemble(stack, settings, registry, resolver, verify)
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
                worker.chain.retune(chain_settings(settings, source))
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

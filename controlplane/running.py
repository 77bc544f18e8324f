"""The ``worker`` process: the composition root (command target :func:`worker_command`).

One anyio task group: the bus subscription (retained state first, then live events) feeding the
ledger in every replica; the reconcilers, resync and CRD repair only in the leader; the HTTPS
endpoint (``/metrics``, ``/readyz``, ``/livez``) throughout. With a reachable Kubernetes API the
sink is the API (CRDs applied at start-up, Lease-based election); without one (``standalone``,
or ``--kubeconfig=none``) the same reconcilers keep their ledger in the bus's KV bucket.

Samples are never written to the API: they stay on the bus (retained) and in metrics.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import cast

import anyio
import msgspec
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from bus import connection, kv, state, subscribing
from bus import settings as bus_settings
from bus.errors import BusError
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from controlplane import crds, errors, leading, resolving
from controlplane.k8s import client
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling.artifacting import ArtifactReconciler
from controlplane.reconciling.ledger import Ledger
from controlplane.reconciling.nodes import NodeReconciler
from controlplane.reconciling.processing import Processor
from controlplane.resolving import Resolver
from controlplane.sinks import KubeSink, KvSink, Sink
from kit import serving

__all__ = ["Worker", "WorkerSettings", "run", "settings_from", "worker_command"]

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_USAGE = 2


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the worker needs, built once at the edge."""

    bus: BusSettings
    kube: client.KubeSettings | None
    """None: no cluster, keep the ledger in the bus (KV sink)."""
    https: serving.HttpsSettings
    leader_election: bool = True
    leader: leading.LeaderSettings = leading.LeaderSettings()
    identity: str = ""
    concurrency: int = 16
    resync_s: float = 60.0
    crd_check_s: float = 60.0
    max_nodes: int = 20_000
    hub_endpoint: str = "https://huggingface.co"
    """Where ModelArtifacts are resolved (``--hf-endpoint``, else ``$HF_ENDPOINT``)."""
    artifact_retry_base_s: float = 1.0
    artifact_retry_cap_s: float = 300.0


def settings_from(values: Mapping[str, object], env: Mapping[str, str]) -> WorkerSettings:
    """Build the settings from parsed flags (``--kubeconfig=none``: no cluster)."""
    kubeconfig = cast(str, values.get("kubeconfig") or "") or env.get("KUBECONFIG") or None
    kube = None
    if kubeconfig != "none":
        kube = client.KubeSettings(
            kubeconfig=kubeconfig,
            qps=float(cast(float, values.get("kube_conn_qps", 200.0))),
            burst=int(cast(int, values.get("kube_conn_burst", 400))),
            timeout_s=float(cast(float, values.get("kube_conn_timeout", 300.0))),
        )
    return WorkerSettings(
        bus=bus_settings.from_flags(values, env),
        kube=kube,
        https=serving.HttpsSettings(
            bind_address=cast(str, values.get("bind_address") or "0.0.0.0"),
            port=int(cast(int, values.get("secure_port", 31443))),
            cert_dir=cast(str, values.get("cert_dir") or "") or None,
        ),
        leader_election=bool(values.get("kube_leader_election", True)),
        leader=leading.LeaderSettings(
            name=cast(str, values.get("kube_leader_election_id") or "worker.gpustack.ai"),
            namespace=env.get("KUBERNETES_POD_NAMESPACE", "gpustack-system"),
            lease_s=float(cast(float, values.get("kube_leader_lease", 15.0))),
            renew_timeout_s=float(cast(float, values.get("kube_leader_renew_timeout", 10.0))),
        ),
        identity=env.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}",
        hub_endpoint=cast(str, values.get("hf_endpoint") or "")
        or env.get("HF_ENDPOINT")
        or "https://huggingface.co",
    )


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
            serving.https_server(settings.https, registry=registry, ready=lambda: conn.is_connected)
        )
        worker.url = server.url

        async def lead() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(processor.resync_every, settings.resync_s)
                tg.start_soon(artifacts.resync_every, settings.resync_s)
                if api is not None:
                    tg.start_soon(crds.keep_present, api, settings.crd_check_s)
                    tg.start_soon(processor.watch_nodes, api)
                    tg.start_soon(artifacts.watch, api)
                tg.start_soon(artifacts.work, max(1, settings.concurrency // 4))
                await processor.work(settings.concurrency)

        def on_change(now_leading: bool) -> None:
            worker.leading = now_leading
            metrics.leader.set(1 if now_leading else 0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(_ingest, sub, processor)
            if api is not None and settings.leader_election:
                tg.start_soon(_elected, api, settings, lead, on_change)
            else:
                on_change(True)
                tg.start_soon(lead)
            task_status.started(worker)


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


def worker_command(values: dict[str, object], positionals: list[str]) -> int:
    """``gpustack-operator worker``: run the control plane until interrupted."""
    if positionals:
        log.error("unexpected arguments: %s", " ".join(positionals))
        return EXIT_USAGE
    settings = settings_from(values, os.environ)

    async def main() -> None:
        await run(settings)

    try:
        anyio.run(main)
    except KeyboardInterrupt:
        return 0
    except (errors.ControlPlaneError, BusError, serving.ServingFailed) as e:
        log.error("worker: %s", e)
        return EXIT_FAILED
    return 0

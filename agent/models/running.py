"""The ``model-manager`` process: the composition root and its command target.

One task group: the materializer (hosts download jobs), the reporter (bus + metrics), the
collector (periodic), the spec follower, the CSI server on its unix socket and the HTTPS
endpoint. :func:`plugin` is the async context manager tests use directly; it is ready when
it yields (references rebuilt, socket listening). Leaving it cancels downloads (partial files
stay for the next start), closes the socket and the Hub session.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry

from agent.models import (
    collecting,
    downloading,
    kvpolicy,
    layout,
    materializing,
    reporting,
    server,
)
from agent.models.metrics import ModelMetrics
from agent.models.policy import MemoryPolicy, Policy
from agent.models.settings import ModelManagerSettings
from agent.models.volumes import Volumes
from bus import connection, kv, publishing
from bus.metrics import BusMetrics
from bus.records import StoreSpec
from hub import client as hub_client
from kit import serving

__all__ = ["Plugin", "plugin", "run", "serve"]

log = logging.getLogger(__name__)


@dataclass
class Plugin:
    settings: ModelManagerSettings
    cache: layout.Cache
    volumes: Volumes
    materializer: materializing.Materializer
    collector: collecting.Collector
    reporter: reporting.Reporter
    metrics: ModelMetrics
    socket: Path


def _hub_settings(settings: ModelManagerSettings, spec: StoreSpec | None) -> hub_client.HubSettings:
    if spec is None:
        return hub_client.HubSettings(endpoint=settings.hub_endpoint)
    return hub_client.HubSettings(
        endpoint=spec.hub.hugging_face_endpoint or settings.hub_endpoint,
        proxy=spec.hub.https_proxy,
    )


async def _follow_spec(policy: Policy, limits: downloading.Limits, every_s: float) -> None:
    """Apply download limits from the NodeModelStore spec as it changes (invalid: ignored)."""
    while True:
        spec = policy.spec()
        if spec is not None and not spec.problems():
            limits.update(spec.download.concurrency, spec.download.bytes_per_second)
        await anyio.sleep(every_s)


@asynccontextmanager
async def plugin(
    settings: ModelManagerSettings,
    *,
    policy: Policy,
    sink: reporting.Sink | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[Plugin]:
    """Run the plugin until the block exits. :raises CacheCorrupt: foreign cache root."""
    tuning = settings.tuning
    cache = await anyio.to_thread.run_sync(layout.Cache.open, settings.cache_root)
    metrics = ModelMetrics(registry)
    spec = policy.spec()
    spec_now = spec if spec is not None and not spec.problems() else StoreSpec()
    limits = downloading.Limits(spec_now.download.concurrency, spec_now.download.bytes_per_second)
    claim = anyio.Lock()
    async with hub_client.client(_hub_settings(settings, spec)) as hub:
        volumes_box: list[Volumes] = []
        materializer_box: list[materializing.Materializer] = []
        collector = collecting.Collector(
            cache,
            claim=claim,
            busy=lambda: volumes_box[0].referenced() | set(materializer_box[0].jobs),
            remaining=lambda h: materializer_box[0].remaining(h),
            spec=policy.spec,
            metrics=metrics,
            idle_s=tuning.collect_idle_s,
            clock=clock,
        )
        materializer = materializing.Materializer(
            cache,
            hub,
            limits,
            tuning=tuning,
            metrics=metrics,
            reserve=collector.reserve,
            clock=clock,
        )
        materializer_box.append(materializer)
        reporter = reporting.Reporter(
            settings.node_name, cache, materializer, sink, metrics=metrics, tuning=tuning
        )
        materializer.changed = reporter.changed
        volumes = Volumes(
            cache,
            policy,
            materializer,
            pods_dir=settings.pods_dir,
            metrics=metrics,
            claim=claim,
            default_token=settings.hub_token,
        )
        volumes_box.append(volumes)
        volumes.changed = reporter.changed
        reporter.references = volumes.reference_counts
        await volumes.rebuild()
        async with anyio.create_task_group() as tg:
            await tg.start(materializer.run)
            tg.start_soon(reporter.run)
            tg.start_soon(collector.run, tuning.collect_every_s)
            tg.start_soon(_follow_spec, policy, limits, 5.0)
            handlers = [
                server.Identity(settings.version, lambda: volumes.ready and policy.synced()),
                server.Node(settings.node_name, volumes),
            ]
            async with server.serving(settings.socket_path, handlers) as socket:
                yield Plugin(
                    settings, cache, volumes, materializer, collector, reporter, metrics, socket
                )
            tg.cancel_scope.cancel()


async def serve(settings: ModelManagerSettings, policy: MemoryPolicy) -> None:
    """The whole process: bus (publisher and the artifacts it carries), plugin and HTTPS.

    With a bus, ``policy`` follows the control plane's KV bucket; without one it stays as given
    (empty and unsynced in production: every publish answers UNAVAILABLE).
    """
    registry = CollectorRegistry()
    if settings.bus is None:
        await _serve_plugin(settings, policy, None, registry)
        return
    async with (
        connection.connect(settings.bus, name=f"model-manager/{settings.node_name}") as conn,
        publishing.publisher(conn, settings=settings.bus, metrics=BusMetrics(registry)) as sink,
        anyio.create_task_group() as tg,
    ):
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
        await tg.start(kvpolicy.follow, bucket, settings.node_name, policy)
        await _serve_plugin(settings, policy, sink, registry)


async def _serve_plugin(
    settings: ModelManagerSettings,
    policy: Policy,
    sink: reporting.Sink | None,
    registry: CollectorRegistry,
) -> None:
    async with plugin(settings, policy=policy, sink=sink, registry=registry) as running:

        async def downloads() -> serving.Response:
            body = reporting.downloads_json(running.materializer.jobs)
            return serving.Response(body=body, content_type="application/json")

        async with serving.https_server(
            settings.https,
            registry=registry,
            ready=lambda: running.volumes.ready and policy.synced(),
            routes={"/model/downloads": downloads},
        ) as endpoint:
            log.info(
                "model-manager serving CSI on %s and HTTPS on %s", running.socket, endpoint.url
            )
            await anyio.sleep_forever()


async def run(settings: ModelManagerSettings) -> None:
    """The ``model-manager`` service: :func:`serve` with a policy the bus fills."""
    await serve(settings, MemoryPolicy())  # filled from the bus KV bucket by kvpolicy.follow

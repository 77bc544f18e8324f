"""The ``model-manager`` process: the composition root and its command target.

One task group: the materializer (hosts download jobs), the reporter (bus + metrics), the
collector (periodic), the spec follower, the CSI server on its unix socket and the HTTPS
endpoint. :func:`plugin` is the async context manager tests use directly; it is ready when
it yields (references rebuilt, socket listening). Leaving it cancels downloads (partial files
stay for the next start), closes the socket and the Hub session.

With a bus, :func:`serve` creates the publisher first and connects beside the plugin, so CSI
and HTTPS never wait for NATS; the KV policy follower starts once the connection is up. Until
it has synced, the policy the last run kept on the node serves cached models
(:mod:`agent.models.policyfile`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec
from prometheus_client import CollectorRegistry

from agent.models import (
    collecting,
    downloading,
    kvpolicy,
    layout,
    materializing,
    peerclient,
    peering,
    peerserver,
    policyfile,
    reporting,
    server,
)
from agent.models.errors import CacheUnusable
from agent.models.metrics import ModelMetrics
from agent.models.policy import MemoryPolicy, Policy
from agent.models.settings import ModelManagerSettings
from agent.models.volumes import Volumes
from bus import connection, kv, publishing
from bus.accessreviews import BusReviewer
from bus.errors import BusError
from bus.metrics import BusMetrics
from bus.peers import PeerOffer
from bus.presence import Presence
from bus.records import StoreSpec
from bus.settings import BusSettings
from hub import client as hub_client
from hub.modelscope import ModelScopeClient
from kit import backoff, serving
from kit.options import SettingsError

__all__ = ["Plugin", "plugin", "run", "serve"]

log = logging.getLogger(__name__)

_BIND_RETRY_CAP_S = 30.0


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
    """The environment's Hub conventions, with the NodeModelStore spec's endpoint and proxy
    (which applies to every request, as it always has) winning once synced."""
    own = hub_client.HubSettings.of(settings.hub_endpoint, settings.hub_env)
    if spec is None:
        return own
    own = msgspec.structs.replace(
        own, endpoint=spec.hub.hugging_face_endpoint or settings.hub_endpoint
    )
    if spec.hub.https_proxy:
        own = msgspec.structs.replace(
            own, proxy=spec.hub.https_proxy, http_proxy=spec.hub.https_proxy, no_proxy=()
        )
    if spec.hub.no_proxy:
        no_proxy = tuple(p.strip() for p in spec.hub.no_proxy.split(",") if p.strip())
        own = msgspec.structs.replace(own, no_proxy=no_proxy)
    return own


def _modelscope_settings(
    settings: ModelManagerSettings, spec: StoreSpec | None
) -> hub_client.HubSettings:
    """As :func:`_hub_settings` (proxies, CA) with ModelScope's endpoint: the spec's
    ``hub.modelScopeEndpoint`` once synced, else ``MODELSCOPE_DOMAIN``. ``HF_HUB_OFFLINE`` is
    Hugging Face's switch and does not stop ModelScope."""
    endpoint = (spec.hub.model_scope_endpoint if spec is not None else None) or (
        settings.modelscope_endpoint
    )
    return msgspec.structs.replace(_hub_settings(settings, spec), endpoint=endpoint, offline=False)


async def _follow_spec(policy: Policy, limits: downloading.Limits, every_s: float) -> None:
    """Apply download limits from the NodeModelStore spec as it changes (invalid: ignored)."""
    while True:
        spec = policy.spec()
        if spec is not None and not spec.problems():
            limits.update(spec.download.concurrency, spec.download.bytes_per_second)
        await anyio.sleep(every_s)


@dataclass
class _Parts:
    volumes: Volumes
    materializer: materializing.Materializer
    collector: collecting.Collector
    reporter: reporting.Reporter


def _assemble(  # noqa: PLR0913 - the parts the composition root wires, each used once
    settings: ModelManagerSettings,
    cache: layout.Cache,
    hub: hub_client.HubClient,
    limits: downloading.Limits,
    policy: Policy,
    sink: reporting.Sink | None,
    metrics: ModelMetrics,
    clock: Callable[[], float],
    peers: peerclient.PeerPull | None = None,
    modelscope: hub_client.HubClient | None = None,
) -> _Parts:
    """Build the parts in dependency order; each gets what it uses in its constructor.

    ``changes`` comes first (the materializer and the volumes signal it, the reporter waits on
    it); the collector comes after what it must not collect (mounted, downloading); the
    materializer reserves room through it once running (:meth:`Materializer.run`).
    """
    tuning = settings.tuning
    claim = anyio.Lock()
    changes = reporting.Changes()
    materializer = materializing.Materializer(
        cache, hub, limits, tuning=tuning, metrics=metrics, changed=changes.changed, clock=clock,
        peers=peers, modelscope=modelscope,
    )  # fmt: skip
    volumes = Volumes(
        cache, policy, materializer, pods_dir=settings.pods_dir, metrics=metrics, claim=claim,
        default_token=settings.hub_token, changed=changes.changed,
    )  # fmt: skip
    collector = collecting.Collector(
        cache,
        claim=claim,
        busy=lambda: volumes.referenced() | set(materializer.jobs),
        remaining=materializer.remaining,
        spec=policy.spec,
        metrics=metrics,
        idle_s=tuning.collect_idle_s,
        clock=clock,
    )
    reporter = reporting.Reporter(
        settings.node_name, cache, materializer, sink, changes=changes,
        references=volumes.reference_counts, metrics=metrics, tuning=tuning,
    )  # fmt: skip
    return _Parts(volumes, materializer, collector, reporter)


@asynccontextmanager
async def plugin(
    settings: ModelManagerSettings,
    *,
    policy: Policy,
    sink: reporting.Sink | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
    peers: peering.Peering | None = None,
) -> AsyncIterator[Plugin]:
    """Run the plugin until the block exits. :raises CacheCorrupt: foreign cache root.

    ``peers``: serve published trees to peer model agents and pull from them first (its
    directory is fed, and its offer sent, by :func:`peering.follow` on the bus).
    """
    cache = await anyio.to_thread.run_sync(layout.Cache.open, settings.cache_root)
    metrics = ModelMetrics(registry)
    spec = policy.spec()
    spec_now = spec if spec is not None and not spec.problems() else StoreSpec()
    limits = downloading.Limits(spec_now.download.concurrency, spec_now.download.bytes_per_second)
    async with (
        hub_client.client(_hub_settings(settings, spec)) as hub,
        hub_client.client(_modelscope_settings(settings, spec), kind=ModelScopeClient) as ms,
        _peer_pull(peers, policy) as pull,
    ):
        p = _assemble(settings, cache, hub, limits, policy, sink, metrics, clock, pull, ms)
        await p.volumes.rebuild()
        async with anyio.create_task_group() as tg:
            await tg.start(p.materializer.run, p.collector.reserve)
            tg.start_soon(p.reporter.run)
            tg.start_soon(p.collector.run, settings.tuning.collect_every_s)
            tg.start_soon(_follow_spec, policy, limits, 5.0)
            handlers = [
                server.Identity(settings.version, lambda: p.volumes.ready and policy.synced()),
                server.Node(settings.node_name, p.volumes),
            ]
            async with (
                server.serving(settings.socket_path, handlers) as socket,
                _peer_serving(settings, cache, peers),
            ):
                yield Plugin(
                    settings, cache, p.volumes, p.materializer, p.collector, p.reporter,
                    metrics, socket,
                )  # fmt: skip
            tg.cancel_scope.cancel()


@asynccontextmanager
async def _peer_pull(
    peers: peering.Peering | None, policy: Policy
) -> AsyncIterator[peerclient.PeerPull | None]:
    """The materializer's way to peers (None: no ``--peer-port``), asking none while the
    NodeModelStore spec's ``download.peerSync`` is false, on an HTTP client of its own (the
    Hub's proxies never apply to a peer)."""
    if peers is None:
        yield None
        return

    def enabled() -> bool:
        spec = policy.spec()
        return spec is None or bool(spec.problems()) or spec.download.peer_sync

    async with peerclient.pull(
        peers.directory, node=peers.node, key=peers.key, enabled=enabled
    ) as own:
        yield own


@asynccontextmanager
async def _peer_serving(
    settings: ModelManagerSettings, cache: layout.Cache, peers: peering.Peering | None
) -> AsyncIterator[None]:
    """Serve published trees to peers while inside; sets ``peers.url`` once listening."""
    if peers is None:
        yield
        return
    served = peerserver.PeerServer(settings.node_name, cache, peers.directory, peers.settings)
    async with peerserver.serve(served) as endpoint:
        peers.url = f"http://{_host(peers.settings.address or endpoint.host)}:{endpoint.port}"
        log.info("serving published models to peers on %s", peers.url)
        try:
            yield
        finally:
            peers.url = None


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


async def serve(settings: ModelManagerSettings, policy: MemoryPolicy) -> None:
    """The whole process: bus (publisher and the artifacts it carries), plugin and HTTPS.

    The publisher exists before the connection, so CSI and HTTPS serve at once, NATS reachable
    or not; models events wait in its outbox. Until ``policy`` is synced it holds the view kept
    on the node by the last run, provisionally (cached models mount, downloads answer
    UNAVAILABLE); with no such view every publish answers UNAVAILABLE. With a bus, ``policy``
    follows the control plane's KV bucket once connected (each change kept on the node);
    without one it stays as given.
    """
    registry = CollectorRegistry()
    reviewer = BusReviewer(settings.node_name)
    await _assume_kept_policy(settings, policy)
    if settings.bus is None:
        if settings.https.auth == "review":
            log.warning("no bus: /metrics and /model/downloads answer 503 (--metrics-auth=review)")
        if settings.peers.enabled:
            log.warning("no bus: no peer is known or admitted (--peer-port)")
        await _serve_plugin(settings, policy, None, registry, reviewer, None, None)
        return
    peers = peering.Peering(settings.node_name, settings.peers) if settings.peers.enabled else None
    presence = Presence(since=anyio.current_time())
    async with (
        # The worker creates the streams and buckets; an agent may not (bus.identity).
        publishing.publisher(
            settings=settings.bus, metrics=BusMetrics(registry), ensure_streams=False
        ) as pub,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(
            _follow_bus, settings.bus, settings.node_name, pub, policy, reviewer,
            settings.cache_root, presence, peers, name="bus",
        )  # fmt: skip
        await _serve_plugin(settings, policy, pub, registry, reviewer, presence, peers)


async def _follow_bus(
    bus: BusSettings,
    node: str,
    pub: publishing.Publisher,
    policy: MemoryPolicy,
    reviewer: BusReviewer,
    cache_root: Path,
    presence: Presence,
    peers: peering.Peering | None,
) -> None:
    """Connect (retrying forever), then publish, review and follow the policy through it;
    with ``peers``, also read the peers' offers and send this node's.

    Runs until cancelled; leaving flushes the outbox within ``drain_timeout_s``, then closes.
    A lost connection is replaced for ever (:mod:`bus.connection`), told to ``presence``.
    """
    async with (
        connection.connect(bus, name=f"model-manager/{node}", presence=presence) as conn,
        pub.attach(conn),
        reviewer.attach(conn),
        anyio.create_task_group() as tg,
    ):
        bucket = await _bind_agents_bucket(conn, bus)
        kept = functools.partial(policyfile.save, policyfile.path_in(cache_root), node)
        tg.start_soon(
            functools.partial(kvpolicy.follow, bucket, node, policy, changed=kept),
            name="policy-follower",
        )
        if peers is not None:
            tg.start_soon(_follow_peers, conn, peers, cache_root, name="peers")


async def _follow_peers(conn: connection.Connection, peers: peering.Peering, root: Path) -> None:
    """Peers' offers in, this node's out (its published digests, read from the cache)."""
    cache = await anyio.to_thread.run_sync(layout.Cache.open, root)

    async def own() -> PeerOffer | None:
        return peers.offer(await anyio.to_thread.run_sync(cache.published_hexes))

    await peering.follow(conn, peers.directory, own, every_s=peers.settings.announce_s)


async def _assume_kept_policy(settings: ModelManagerSettings, policy: MemoryPolicy) -> None:
    """Take the view the last run kept, provisionally, unless ``policy`` is already synced.

    The cache is opened first: it refuses a foreign root before anything is written in it,
    and the policy file is only ever written inside a cache with its layout.
    """
    await anyio.to_thread.run_sync(layout.Cache.open, settings.cache_root)
    kept = await policyfile.load(policyfile.path_in(settings.cache_root), settings.node_name)
    if kept is not None and policy.assume(list(kept.artifacts), kept.spec):
        log.info(
            "serving cached models with the policy kept on the node (%d artifact(s)) until "
            "the bus syncs",
            len(kept.artifacts),
        )


async def _bind_agents_bucket(conn: connection.Connection, bus: BusSettings) -> kv.Bucket:
    """The worker's bucket, once it exists: agents only bind it (the worker creates it)."""
    failures = 0
    while True:
        try:
            return await kv.open_bucket(conn, kv.AGENTS_BUCKET, create=False)
        except BusError as e:
            failures += 1
            delay = backoff.delay(failures, first_s=bus.reconnect_wait_s, max_s=_BIND_RETRY_CAP_S)
            log.warning("cannot bind the agents' bucket (%s); retrying in %.1fs", e, delay)
            await anyio.sleep(delay)


async def _serve_plugin(
    settings: ModelManagerSettings,
    policy: Policy,
    pub: publishing.Publisher | None,
    registry: CollectorRegistry,
    reviewer: BusReviewer,
    presence: Presence | None,
    peers: peering.Peering | None,
) -> None:
    """CSI and HTTPS (and the peer endpoint, with ``peers``). With a bus (``presence``), ``/readyz`` also needs it connected and
    ``/livez`` fails once off it for longer than ``max_offline_s`` (a connection that never
    gives up and still is not back is stuck in a way only a restart may cure)."""
    bus = settings.bus

    def on_bus() -> bool:
        return presence is None or presence.online

    def live() -> bool:
        if presence is None or bus is None:
            return True
        return presence.alive(anyio.current_time(), bus.max_offline_s)

    async with plugin(settings, policy=policy, sink=pub, registry=registry, peers=peers) as running:
        if pub is not None:
            pub.on_reconnect(running.reporter.republish)  # a server that lost it gets it back

        async def downloads() -> serving.Response:
            body = reporting.downloads_json(running.materializer.jobs)
            return serving.Response(body=body, content_type="application/json")

        async with serving.https_server(
            settings.https,
            registry=registry,
            ready=lambda: running.volumes.ready and policy.synced() and on_bus(),
            live=live,
            routes={"/model/downloads": downloads},
            authorizer=reviewer,
        ) as endpoint:
            log.info(
                "model-manager serving CSI on %s and HTTPS on %s", running.socket, endpoint.url
            )
            await anyio.sleep_forever()


async def run(settings: ModelManagerSettings) -> None:
    """The ``model-manager`` service: :func:`serve` with a policy the bus fills.

    :raises SettingsError: ``--cache-root`` cannot be made or written (exit 2, the reason).
    """
    try:  # first: a cache root that cannot be used is the flag's fault, said as such
        await anyio.to_thread.run_sync(layout.Cache.open, settings.cache_root)
    except CacheUnusable as e:
        raise SettingsError(f"--cache-root: {e}") from e
    await serve(settings, MemoryPolicy())  # filled from the bus KV bucket by kvpolicy.follow

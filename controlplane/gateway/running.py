"""The worker-gateway service: serve the API, keep the clusters a GPUStack server subscribes.

One task group holds every subscribed cluster's loop (:mod:`controlplane.gateway.subscriptions`);
the endpoint (:mod:`controlplane.gateway.serving`) answers from it. The gateway is ready as soon
as it serves: it starts with no cluster and waits for ``POST /apis/workers``. A cluster's
troubles (refusals of the GPUStack server, a worker away) are that cluster's state, never the
process's.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Gauge

from controlplane.access.reviewer import KubeReviewer
from controlplane.gateway import api, upstream
from controlplane.gateway.hub import Hub
from controlplane.gateway.serving import serve
from controlplane.gateway.settings import GatewaySettings
from controlplane.gateway.subscriptions import Manager
from controlplane.gateway.upstream import ClusterApi
from controlplane.k8s import client
from kit.access import Authorizer

__all__ = ["Gateway", "run"]

log = logging.getLogger(__name__)


class Gateway:
    """What a running gateway tells its owner (tests)."""

    def __init__(self, manager: Manager, where: str) -> None:
        self.manager = manager
        self.where = where


@asynccontextmanager
async def _authorizer(settings: GatewaySettings) -> AsyncIterator[Authorizer | None]:
    """Token review for the HTTPS endpoint, when it reviews; nothing on a socket."""
    if settings.unix_path is not None or settings.https.auth == "none" or settings.kube is None:
        yield None
        return
    async with client.open_client(settings.kube) as kube:
        yield KubeReviewer(kube)


@asynccontextmanager
async def _connector(settings: GatewaySettings) -> AsyncIterator[Callable[[str, str], ClusterApi]]:
    """How a subscription's (cluster, token) becomes a client, per ``--worker-conn-mode``."""
    up = settings.upstream
    if up.mode == "loopback" and up.kube is not None:
        async with client.open_client(up.kube) as kube:
            shared = upstream.LoopbackApi(kube)
            yield lambda _cluster, _token: shared
        return
    async with upstream.open_session(up) as session:
        yield lambda cluster, token: upstream.ProxyApi(
            session, up.base_url(cluster), token, up.timeout_s
        )


def _gauge(registry: CollectorRegistry, manager: Manager) -> None:
    gauge = Gauge("gpustack_gateway_clusters", "Subscribed clusters, by state", ["state"],
                  registry=registry)  # fmt: skip

    def counter(ready: bool) -> Callable[[], float]:
        return lambda: sum(c.ready is ready for c in manager.clusters.values())

    for state, ready in (("Ready", True), ("Pending", False)):
        gauge.labels(state).set_function(counter(ready))


async def run(
    settings: GatewaySettings,
    *,
    registry: CollectorRegistry | None = None,
    task_status: TaskStatus[Gateway] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled; ``task_status.started`` once it serves."""
    registry = registry or CollectorRegistry(auto_describe=True)
    hub = Hub()
    async with AsyncExitStack() as stack:
        connect = await stack.enter_async_context(_connector(settings))
        authorizer = await stack.enter_async_context(_authorizer(settings))
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        manager = Manager(settings, connect, hub, tg)
        _gauge(registry, manager)
        where = await stack.enter_async_context(
            serve(
                unix_path=settings.unix_path, https=settings.https,
                routes=api.handlers(manager, hub), registry=registry, ready=lambda: True,
                authorizer=authorizer,
            )
        )  # fmt: skip
        stack.callback(hub.close)  # first on exit: watch streams end before the server stops
        log.info("worker-gateway serving on %s (%s mode)", where, settings.upstream.mode)
        task_status.started(Gateway(manager, where))
        await anyio.sleep_forever()

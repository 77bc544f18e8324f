"""The worker-gateway service: gather member summaries in rounds, serve the aggregate.

One task group: the serving endpoint and the round loop. A round asks every member over the bus
(:mod:`controlplane.gateway.gathering`), folds the answers into the membership book (pure,
:mod:`controlplane.gateway.membership`) and the catalog (:mod:`controlplane.gateway.catalog`),
and logs who joined, left or changed state. Bus trouble costs a round, never the process: the
members all turn Unreachable after one missed round, which is what the readiness timeout means.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Counter, Gauge

from bus import connection
from bus.errors import BusError
from controlplane.gateway import gathering, membership
from controlplane.gateway.catalog import Catalog
from controlplane.gateway.serving import serve
from controlplane.gateway.settings import GatewaySettings
from controlplane.k8s import client
from controlplane.reviewing import KubeReviewer
from kit.access import Authorizer

__all__ = ["Gateway", "run"]

log = logging.getLogger(__name__)


class Gateway:
    """What a running gateway tells its owner (tests)."""

    def __init__(self, catalog: Catalog, where: str) -> None:
        self.catalog = catalog
        self.where = where


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.members = Gauge(
            "gpustack_gateway_members", "Member clusters by state", ["state"], registry=registry
        )
        self.rounds = Counter(
            "gpustack_gateway_rounds", "Gather rounds, by outcome", ["outcome"], registry=registry
        )
        self.invalid = Counter(
            "gpustack_gateway_invalid_answers",
            "Member answers dropped as unreadable or too large",
            registry=registry,
        )


async def one_round(
    conn: connection.Connection, settings: GatewaySettings, catalog: Catalog, metrics: _Metrics
) -> None:
    """Ask, fold, publish to the catalog; a bus failure counts as a round nobody answered."""
    try:
        gathered = await gathering.gather(
            conn,
            timeout_s=settings.readiness_timeout_s,
            expected=set(catalog.members),
            settle_s=settings.settle_s,
            max_replies=2 * settings.max_members,
        )
        metrics.rounds.labels("ok").inc()
    except BusError as e:
        log.warning("fleet round failed: %s", e)
        gathered = gathering.Gathered()
        metrics.rounds.labels("failed").inc()
    metrics.invalid.inc(gathered.invalid)
    after = membership.after_round(
        catalog.members,
        membership.replies_by_cluster(gathered.replies),
        anyio.current_time(),
        max_members=settings.max_members,
        forget_after_s=settings.forget_after_s,
    )
    for cluster in after.refused:
        log.warning("fleet: member %s refused: already %d members", cluster, settings.max_members)
    for cluster in after.changed:
        state = after.book[cluster].state if cluster in after.book else "forgotten"
        log.info("fleet: member %s is %s", cluster, state)
    catalog.update(after.book)
    for state in ("Active", "NotReady", "Unreachable"):
        metrics.members.labels(state).set(sum(m.state == state for m in after.book.values()))


async def _rounds(
    conn: connection.Connection, settings: GatewaySettings, catalog: Catalog, metrics: _Metrics
) -> None:
    while True:
        started = anyio.current_time()
        await one_round(conn, settings, catalog, metrics)
        await anyio.sleep(max(0.0, started + settings.round_interval_s - anyio.current_time()))


@asynccontextmanager
async def _authorizer(settings: GatewaySettings) -> AsyncIterator[Authorizer | None]:
    """Token review for the HTTPS endpoint, when it reviews; nothing on a socket."""
    if settings.unix_path is not None or settings.https.auth == "none" or settings.kube is None:
        yield None
        return
    async with client.open_client(settings.kube) as api:
        yield KubeReviewer(api)


async def run(
    settings: GatewaySettings,
    *,
    registry: CollectorRegistry | None = None,
    task_status: TaskStatus[Gateway] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled; ``task_status.started`` once it serves."""
    registry = registry or CollectorRegistry(auto_describe=True)
    metrics = _Metrics(registry)
    catalog = Catalog()
    async with AsyncExitStack() as stack:
        conn = await stack.enter_async_context(
            connection.connect(settings.bus, name="worker-gateway")
        )
        authorizer = await stack.enter_async_context(_authorizer(settings))
        where = await stack.enter_async_context(
            serve(
                unix_path=settings.unix_path, https=settings.https, catalog=catalog,
                registry=registry, ready=lambda: catalog.ready and conn.is_connected,
                authorizer=authorizer,
            )
        )  # fmt: skip
        stack.callback(catalog.close)  # first on exit: watch streams end before the server stops
        log.info("worker-gateway serving on %s", where)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_rounds, conn, settings, catalog, metrics, name="fleet-rounds")
            task_status.started(Gateway(catalog, where))

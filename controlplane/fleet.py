"""A member worker's side of the fleet contract: answer the gateway's summary request.

The worker answers :data:`bus.fleet.SUMMARY_SUBJECT` with its cluster name, its readiness and
its InstanceTypes' four views (:class:`bus.fleet.MemberSummary`), in the queue group of its
cluster so that one replica answers per cluster. Answers are built on the event loop from what the
worker already holds (no API call per request), and requests that arrive faster than they can be
answered are dropped, never queued without bound: the gateway's next round asks again.

Where the views come from: with a cluster, the InstanceType objects the chain reconciler last
listed and wrote (:class:`ChainInstanceTypes`: user-made types and ``spec.inactive`` included);
under ``--kubeconfig=none``, the same pure planning run over the worker's bus ledger
(:class:`LedgerInstanceTypes`: the node-derived types, every node taken as linux/amd64).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import msgspec

from bus import fleet
from bus.connection import Connection
from bus.errors import BusError
from bus.fleet import InstanceTypeSummary, MemberSummary, Views
from controlplane.chain import inventory
from controlplane.chain.kueue import plan_chain
from controlplane.chain.settings import ChainSettings
from controlplane.reconciling.ledger import Ledger

__all__ = [
    "ChainInstanceTypes",
    "InstanceTypeSource",
    "LedgerInstanceTypes",
    "answer",
    "serve_summaries",
    "summaries_of",
]

log = logging.getLogger(__name__)

BACKLOG = 16


class InstanceTypeSource(Protocol):
    def instance_types(self) -> Sequence[InstanceTypeSummary]:
        """The cluster's InstanceTypes as the worker last computed them."""
        ...


def summaries_of(
    statuses: Mapping[str, Mapping[str, Any]], inactive: Iterable[str] = ()
) -> list[InstanceTypeSummary]:
    """Accelerated InstanceTypes' statuses as fleet summaries (CPU-only types carry no views;
    a status that does not read as the four views is left out, logged)."""
    off = set(inactive)
    out: list[InstanceTypeSummary] = []
    for name in sorted(statuses):
        status = statuses[name]
        if "accelerator" not in status:
            continue
        try:
            views = msgspec.convert(status, Views)
        except msgspec.ValidationError as e:
            log.warning("fleet: InstanceType %s: status unreadable: %s", name, e)
            continue
        out.append(InstanceTypeSummary(name=name, views=views, inactive=name in off))
    return out


class LedgerInstanceTypes:
    """The node-derived InstanceTypes of the bus ledger (no cluster)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def instance_types(self) -> Sequence[InstanceTypeSummary]:
        states = {n: s for n in self._ledger.nodes() if (s := self._ledger.get(n)) is not None}
        facts = [inventory.facts_of({"metadata": {"name": n}}, s) for n, s in states.items()]
        plan = plan_chain(
            facts, allocations={n: list(s.allocations.values()) for n, s in states.items()},
            namespaces=(), instance_types={}, cluster_queues={}, active_checks=(),
            settings=ChainSettings(manage_kueue=False),
        )  # fmt: skip
        return summaries_of(plan.statuses)


class InstanceTypeObjects(Protocol):
    def instance_type_objects(self) -> Iterable[Mapping[str, Any]]:
        """The InstanceType objects last listed or written."""
        ...


class ChainInstanceTypes:
    """The InstanceType objects the chain reconciler holds (a cluster)."""

    def __init__(self, chain: InstanceTypeObjects) -> None:
        self._chain = chain

    def instance_types(self) -> Sequence[InstanceTypeSummary]:
        bodies = list(self._chain.instance_type_objects())
        statuses = {b["metadata"]["name"]: b.get("status") or {} for b in bodies}
        inactive = [b["metadata"]["name"] for b in bodies if (b.get("spec") or {}).get("inactive")]
        return summaries_of(statuses, inactive)


def answer(cluster: str, ready: bool, source: InstanceTypeSource) -> bytes:
    """The encoded reply to one request (never raises for what the source holds)."""
    types = tuple(source.instance_types())[: fleet.MAX_INSTANCE_TYPES]
    return fleet.encode(MemberSummary(cluster=cluster, ready=ready, instance_types=types))


@asynccontextmanager
async def serve_summaries(
    conn: Connection, cluster: str, source: InstanceTypeSource, ready: Callable[[], bool]
) -> AsyncIterator[None]:
    """Answer fleet summary requests while inside."""
    send, receive = anyio.create_memory_object_stream[str](BACKLOG)

    def on_request(payload: bytes, reply: str) -> None:
        if not reply:
            return
        try:
            fleet.decode_request(payload)
            send.send_nowait(reply)
        except fleet.InvalidSummary as e:
            log.debug("fleet: %s", e)
        except anyio.WouldBlock:
            log.debug("fleet: request dropped (backlog full)")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def work() -> None:
        async for reply in receive:
            try:
                await conn.publish(reply, answer(cluster, ready(), source))
            except BusError as e:
                log.debug("fleet: cannot answer: %s", e)

    with send, receive:
        async with anyio.create_task_group() as tg:
            tg.start_soon(work, name="fleet-answers")
            async with conn.serve_requests(
                fleet.SUMMARY_SUBJECT, on_request, queue=fleet.queue_of(cluster)
            ):
                yield
            tg.cancel_scope.cancel()

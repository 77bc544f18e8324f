"""A member worker's side of the fleet contract: answer the gateway's summary request.

The worker answers :data:`bus.fleet.SUMMARY_SUBJECT` with its cluster name, its readiness and
its InstanceTypes' four views (:class:`bus.fleet.MemberSummary`), in the queue group of its
cluster so that one replica answers per cluster. Answers are built on the event loop from what the
worker already holds (no API call per request), and requests that arrive faster than they can be
answered are dropped, never queued without bound: the gateway's next round asks again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

import anyio

from bus import fleet
from bus.connection import Connection
from bus.errors import BusError
from bus.fleet import InstanceTypeSummary, MemberSummary

__all__ = ["InstanceTypeSource", "answer", "serve_summaries"]

log = logging.getLogger(__name__)

BACKLOG = 16


class InstanceTypeSource(Protocol):
    def instance_types(self) -> Sequence[InstanceTypeSummary]:
        """The cluster's InstanceTypes as the worker last computed them."""
        ...


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

"""The node's pending sliced/partitioned containers, followed from the bus KV bucket.

The worker writes ``pending.<node>`` (:class:`bus.records.PendingContainers`) into
:data:`bus.kv.AGENTS_BUCKET`; the device agent may direct-get exactly that key
(:mod:`bus.identity`). :func:`attach` binds the bucket (never creating it) on the agent's bus
connection and re-reads the key every ``every_s`` into a :class:`PendingView`, which the device
plugins read synchronously. An unreachable bus, or a malformed record, keeps the last view.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import msgspec

from bus import kv
from bus.connection import Connection
from bus.errors import BusError
from bus.records import PendingContainer, PendingContainers

__all__ = ["PendingView", "attach", "follow", "read_once"]

log = logging.getLogger(__name__)

EVERY_S = 1.0
"""How often the key is re-read: a Pod's Allocate follows its binding within seconds."""


class PendingView:
    """The last ``pending.<node>`` read; calling it gives its containers (none before one).

    It announces its changes (:class:`agent.deviceplugin.claims.Announcing`): an Allocate
    waiting for its claim wakes when a read brings a different list.
    """

    def __init__(self) -> None:
        self.containers: tuple[PendingContainer, ...] = ()
        self.reads = 0
        """Successful reads so far (tests wait for one)."""
        self._changed = anyio.Event()

    def __call__(self) -> tuple[PendingContainer, ...]:
        return self.containers

    def next_change(self) -> anyio.Event:
        """Set at the next read that changes the list."""
        return self._changed

    def update(self, containers: tuple[PendingContainer, ...]) -> None:
        """Adopt a successful read; wake the waiters when the list changed."""
        self.reads += 1
        if containers != self.containers:
            self.containers = containers
            self._changed.set()
            self._changed = anyio.Event()


async def read_once(bucket: kv.Bucket, node: str) -> tuple[PendingContainer, ...] | None:
    """This node's pending containers (none when the key is absent); None: malformed.

    :raises BusError: the bucket is unreachable.
    """
    got = await bucket.get(kv.pending_key(node))
    if got is None:
        return ()
    try:
        record = msgspec.json.decode(got[0], type=PendingContainers)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        log.warning("malformed pending containers of %s (keeping the last view): %s", node, e)
        return None
    return record.containers


async def follow(bucket: kv.Bucket, node: str, view: PendingView, *, every_s: float) -> None:
    """Keep ``view`` equal to the key, re-read every ``every_s``, until cancelled."""
    while True:
        try:
            fresh = await read_once(bucket, node)
        except BusError as e:
            log.warning("cannot read pending containers (keeping the last view): %s", e)
        else:
            if fresh is not None:
                view.update(fresh)
        await anyio.sleep(every_s)


async def _bind_and_follow(conn: Connection, node: str, view: PendingView, every_s: float) -> None:
    """Bind the worker's bucket once it exists (agents may not create it), then follow."""
    while True:
        try:
            bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET, create=False)
            break
        except BusError as e:
            log.warning("cannot bind the agents' bucket (%s); retrying in %.1fs", e, every_s)
            await anyio.sleep(every_s)
    await follow(bucket, node, view, every_s=every_s)


def attach(
    view: PendingView, node: str, *, every_s: float = EVERY_S
) -> Callable[[Connection], AbstractAsyncContextManager[None]]:
    """For :func:`bus.publishing.link`'s ``also``: follow ``pending.<node>`` while linked."""

    @asynccontextmanager
    async def attached(conn: Connection) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                functools.partial(_bind_and_follow, conn, node, view, every_s),
                name="pending-follower",
            )
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    return attached

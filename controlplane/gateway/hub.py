"""The gateway's event fan-out: every cluster's changes, to every open watch.

An event is ``(plural, type, cluster, object)``; ``plural`` None with type ``DELETED`` and no
object means "the cluster is gone: drop everything of it" (sent on unsubscribe). Watchers get
bounded queues: one that falls :data:`BACKLOG` events behind is closed (its client sees the
stream end and lists again) instead of growing the gateway's memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, NamedTuple

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["BACKLOG", "Event", "Hub"]

BACKLOG: Final = 256


class Event(NamedTuple):
    plural: str | None
    type: str
    cluster: str
    object: Mapping[str, Any] | None


class Hub:
    def __init__(self) -> None:
        self._watchers: set[MemoryObjectSendStream[Event]] = set()

    def publish(self, event: Event) -> None:
        for send in list(self._watchers):
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                self._watchers.discard(send)
                send.close()  # too slow: its stream ends, the client lists again
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._watchers.discard(send)

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[MemoryObjectReceiveStream[Event]]:
        """Events from now on, while inside."""
        send, receive = anyio.create_memory_object_stream[Event](BACKLOG)
        self._watchers.add(send)
        try:
            with receive:
                yield receive
        finally:
            self._watchers.discard(send)
            send.close()

    def close(self) -> None:
        """End every watch (the gateway is stopping)."""
        for send in self._watchers:
            send.close()
        self._watchers.clear()

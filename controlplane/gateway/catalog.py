"""The gateway's current aggregate, its resource version, and its watchers.

The state the HTTP side serves. :meth:`Catalog.update` takes a new aggregate (from
:func:`~controlplane.gateway.aggregation.aggregate`), stamps each changed object with a new
``resourceVersion`` and tells every watcher ADDED / MODIFIED / DELETED, Kubernetes-style.

Watchers get bounded queues: one that does not keep up is closed (its client sees the stream end
and lists again, which is what Kubernetes clients do after a watch ends) instead of growing the
gateway's memory.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from controlplane.gateway import aggregation
from controlplane.gateway.membership import MemberState

__all__ = ["Catalog", "Event", "changes"]

Event = tuple[str, dict[str, Any]]
"""``(type, object)`` with type ADDED, MODIFIED or DELETED."""
WATCH_BACKLOG: Final = 256


def _unstamped(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    out["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return out


def changes(old: Mapping[str, dict[str, Any]], new: Mapping[str, dict[str, Any]]) -> list[Event]:
    """The watch events that turn ``old`` into ``new`` (objects compared without versions)."""
    events: list[Event] = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            events.append(("DELETED", old[name]))
        elif name not in old:
            events.append(("ADDED", new[name]))
        elif _unstamped(old[name]) != _unstamped(new[name]):
            events.append(("MODIFIED", new[name]))
    return events


class Catalog:
    def __init__(self) -> None:
        self.version = 0
        self.objects: dict[str, dict[str, Any]] = {}
        self.members: dict[str, MemberState] = {}
        self.rounds = 0
        self._watchers: set[MemoryObjectSendStream[Event]] = set()

    @property
    def ready(self) -> bool:
        """At least one gather round has completed."""
        return self.rounds > 0

    def update(self, members: Mapping[str, MemberState]) -> list[Event]:
        """Take the book after a round; returns (and broadcasts) what changed."""
        self.rounds += 1
        self.members = dict(members)
        new = aggregation.aggregate(members)
        events = changes(self.objects, new)
        if not events:
            return []
        self.version += 1
        stamped: dict[str, dict[str, Any]] = {}
        for name, obj in new.items():
            previous = self.objects.get(name)
            if previous is not None and _unstamped(previous) == obj:
                stamped[name] = previous
            else:
                stamped[name] = _stamp(obj, self.version)
        out = [(kind, stamped.get(obj["metadata"]["name"], obj)) for kind, obj in events]
        self.objects = stamped
        self._broadcast(out)
        return out

    def as_list(self) -> dict[str, Any]:
        return aggregation.as_list(self.objects, self.version)

    def _broadcast(self, events: list[Event]) -> None:
        for send in list(self._watchers):
            try:
                for event in events:
                    send.send_nowait(event)
            except anyio.WouldBlock:
                self._watchers.discard(send)
                send.close()  # too slow: its stream ends, the client lists again
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._watchers.discard(send)

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[MemoryObjectReceiveStream[Event]]:
        """Events from now on, while inside (bounded; closed when the watcher falls behind)."""
        send, receive = anyio.create_memory_object_stream[Event](WATCH_BACKLOG)
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


def _stamp(obj: dict[str, Any], version: int) -> dict[str, Any]:
    out = copy.copy(obj)
    out["metadata"] = {**obj["metadata"], "resourceVersion": str(version)}
    return out

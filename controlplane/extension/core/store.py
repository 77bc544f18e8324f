"""The core's view of one resource: the objects, their resourceVersions and a bounded history.

A provider (the settings store, an informer, a bus ledger) says what the objects are *now*;
:meth:`ObjectCache.sync` compares that with what it held and records one event per object that
changed, each with the next resourceVersion. That gives every resource, whatever backs it, the
same list/watch semantics:

- ``resourceVersion`` is the provider's own integer version of an object when it gives one
  (the store's: the same on every replica), else a counter per cache starting at the
  microsecond the cache was made, so a worker that restarts, or another replica, never hands
  out a number that means something else here (it is too old or too large, never mistaken);
  an event takes its object's version, and a store that changed an object without moving its
  version still gets an event, at the next number;
- the state at any version since :attr:`ObjectCache.oldest` can be rebuilt
  (:meth:`~ObjectCache.state_at`, for exact-version lists and consistent continue tokens), and
  the events after it replayed (:meth:`~ObjectCache.events_after`, for a resumed watch); older
  is :func:`~controlplane.extension.core.failures.expired` (410);
- ``metadata.creationTimestamp`` is kept from the provider when given, otherwise the time the
  cache first saw the object; ``metadata.uid`` likewise (a stable UUID of resource, key and
  creation time); ``metadata.managedFields`` belongs to the cache (server-side apply).

Invariants: objects handed out are never mutated afterwards (the cache replaces, never edits),
and a provider does the same: an object it handed out once and hands out again (the same dict)
is taken as unchanged without comparing, which keeps a sync of a large informer-backed
resource to identity checks;
:meth:`sync` is synchronous and the only writer; :attr:`changed` is set after every sync that
recorded an event, then replaced, so waiters wake once per change.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import msgspec

from controlplane.extension.core.failures import ApiFailure, expired

__all__ = ["HISTORY", "Event", "ObjectCache", "key_of", "now_rfc3339"]

HISTORY: Final = 1000
"""Events kept per resource: a watch or continue token further behind gets 410."""


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _given(obj: dict[str, Any]) -> int | None:
    """The provider's own resourceVersion of ``obj``, when it gave an integer one."""
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return int(rv) if isinstance(rv, str) and rv.isdigit() else None


def _without_version(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


def _same(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Equal but for ``metadata.resourceVersion``."""
    return old == new or _without_version(old) == _without_version(new)


def key_of(obj: dict[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for a cluster-scoped object): the cache's sort order."""
    meta = obj.get("metadata") or {}
    ns, name = meta.get("namespace") or "", meta.get("name") or ""
    return f"{ns}/{name}" if ns else str(name)


class Event(msgspec.Struct, frozen=True):
    type: str
    """``ADDED``, ``MODIFIED`` or ``DELETED``."""
    rv: int
    obj: dict[str, Any]
    """The object at ``rv`` (for DELETED: its last state, stamped with ``rv``)."""
    prev: dict[str, Any] | None
    """The object before (None for ADDED): what :meth:`ObjectCache.state_at` rewinds to."""


class _Entry(msgspec.Struct):
    source: dict[str, Any]
    """The provider's own object (identity: unchanged when it hands out the same one)."""
    raw: dict[str, Any]
    managed: list[dict[str, Any]]
    created: str
    uid: str
    served: dict[str, Any]


class ObjectCache:
    """One resource's objects; ``resource`` seeds the uids, ``now`` stamps creation times."""

    def __init__(
        self,
        resource: str,
        *,
        start: int | None = None,
        history: int = HISTORY,
        now: Callable[[], str] = now_rfc3339,
    ) -> None:
        self.resource = resource
        self.rv = start if start is not None else time.time_ns() // 1000
        self.oldest = self.rv
        """The oldest version whose state can be rebuilt."""
        self._now = now
        self._entries: dict[str, _Entry] = {}
        self._events: deque[Event] = deque()
        self._history = history
        self.changed = anyio.Event()
        self.synced = False

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.served

    def items(self) -> list[dict[str, Any]]:
        """The current objects, sorted by key."""
        return [self._entries[k].served for k in sorted(self._entries)]

    def managed(self, key: str) -> list[dict[str, Any]]:
        entry = self._entries.get(key)
        return [] if entry is None else entry.managed

    def sync(
        self,
        objects: Iterable[dict[str, Any]],
        managed: dict[str, list[dict[str, Any]]] | None = None,
        version: int | None = None,
    ) -> list[Event]:
        """Make the cache hold ``objects`` (the provider's full current set); ``managed``
        replaces the managed fields of those keys; ``version`` is the collection's version when
        the provider has one. :returns: the events recorded."""
        wanted = {key_of(o): o for o in objects}
        if not self.synced:
            self._first(wanted, version)
            return []
        out: list[Event] = []
        floor = self.rv
        for key in sorted(self._entries.keys() - wanted.keys()):
            entry = self._entries.pop(key)
            stamped = self._stamp(entry, self._next(None, version, floor))
            out.append(self._record("DELETED", stamped, entry.served))
        for key in sorted(wanted):
            raw, old = wanted[key], self._entries.get(key)
            fields = (managed or {}).get(key, old.managed if old else [])
            if (
                old is not None
                and old.managed == fields
                and (old.source is raw or _same(old.raw, raw))
            ):
                given = _given(raw)
                if given is not None and given > int(old.served["metadata"]["resourceVersion"]):
                    old.served = self._stamp(old, given)  # the store moved, this object did not
                old.source = raw
                continue
            entry = self._entry(key, raw, fields, old)
            rv = self._next(_given(raw), version, floor)
            entry.served = self._stamp(entry, rv)
            out.append(self._record("ADDED" if old is None else "MODIFIED", entry.served,
                                    None if old is None else old.served, rv))  # fmt: skip
            self._entries[key] = entry
        self.rv = max(self.rv, version or 0)
        if out:
            self.changed.set()
            self.changed = anyio.Event()
        return out

    def _first(self, wanted: dict[str, dict[str, Any]], version: int | None) -> None:
        """The initial state is the base, not a history of additions."""
        self.synced = True
        given = [g for g in map(_given, wanted.values()) if g is not None]
        if version is not None or given:
            self.rv = self.oldest = max([version or 0, *given])
        for key in sorted(wanted):
            entry = self._entry(key, wanted[key], [], None)
            entry.served = self._stamp(entry, _given(wanted[key]) or self.rv)
            self._entries[key] = entry

    def _next(self, given: int | None, version: int | None, floor: int) -> int:
        """The version of an event of this sync: the object's own, else the collection's, when
        newer than ``floor`` (the version before the sync; several objects may share one);
        else the next count, so a watcher at ``floor`` always sees the change."""
        wanted = given if given is not None else version
        if wanted is None:
            return self.rv + 1
        if wanted > floor:
            return max(wanted, self.rv)
        return self.rv if self.rv > floor else floor + 1  # a store that did not move its version

    def _entry(self, key: str, raw: dict[str, Any], managed: list[dict[str, Any]],
               old: _Entry | None) -> _Entry:  # fmt: skip
        source, raw = raw, copy.deepcopy(raw)
        meta = raw.get("metadata") or {}
        created = str(meta.get("creationTimestamp") or (old.created if old else self._now()))
        uid = str(meta.get("uid") or (old.uid if old else "")) or str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"{self.resource}/{key}/{created}")
        )
        return _Entry(
            source=source, raw=raw, managed=list(managed), created=created, uid=uid, served={}
        )

    def _stamp(self, entry: _Entry, rv: int) -> dict[str, Any]:
        served = copy.deepcopy(entry.raw)
        meta = served.setdefault("metadata", {})
        meta.update(resourceVersion=str(rv), creationTimestamp=entry.created, uid=entry.uid)
        if entry.managed:
            meta["managedFields"] = copy.deepcopy(entry.managed)
        return served

    def _record(self, kind: str, obj: dict[str, Any], prev: dict[str, Any] | None,
                rv: int | None = None) -> Event:  # fmt: skip
        self.rv = max(self.rv, int(obj["metadata"]["resourceVersion"]) if rv is None else rv)
        event = Event(kind, self.rv, obj, prev)
        self._events.append(event)
        while len(self._events) > self._history:
            self.oldest = self._events.popleft().rv
        return event

    def _check(self, rv: int, what: str) -> None:
        if rv < self.oldest:
            raise expired(f"too old resource version: {rv} ({self.oldest}): {what}")
        if rv > self.rv:
            raise ApiFailure(
                504, "Timeout", f"Too large resource version: {rv}, current: {self.rv}",
                details={"causes": [{"reason": "ResourceVersionTooLarge",
                                     "message": "Too large resource version"}],
                         "retryAfterSeconds": 1},
            )  # fmt: skip

    def state_at(self, rv: int) -> list[dict[str, Any]]:
        """The objects as they were at ``rv``, sorted by key. :raises ApiFailure: 410 or 504."""
        self._check(rv, "the state at it is no longer kept")
        state = {k: e.served for k, e in self._entries.items()}
        for event in reversed(self._events):
            if event.rv <= rv:
                break
            key = key_of(event.obj)
            if event.prev is None:
                state.pop(key, None)
            else:
                state[key] = event.prev
        return [state[k] for k in sorted(state)]

    def events_after(self, rv: int) -> list[Event]:
        """The events after ``rv``, oldest first. :raises ApiFailure: 410 or 504."""
        self._check(rv, "a watch must list again")
        return [e for e in self._events if e.rv > rv]

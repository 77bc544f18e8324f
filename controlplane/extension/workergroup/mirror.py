"""One served collection in memory: its objects, its resourceVersion and a bounded change history.

A :class:`Mirror` is fed by a source (an informer with a cluster, the bus ledger without one:
:mod:`controlplane.extension.workergroup.feeds`) and read by every request; nothing here does
I/O. Invariants:

- ``objects`` holds the latest body of each key (``(namespace, name)``); ``version`` never goes
  back: it is the collection's resourceVersion, which a list answers with;
- every change is appended to the history with a sequence number (a watcher's cursor) and the
  resourceVersion it happened at (what a client resumes from); the history keeps the last
  ``history`` changes, and :meth:`since` refuses (None: 410 Gone) a resourceVersion older than
  what it still covers, so a client that missed changes lists again instead of missing them;
- a change never blocks: watchers are woken by replacing one :class:`anyio.Event`.

With a cluster the resourceVersions are the API server's (the informer's), so every replica of
the worker answers the same versions and a client may list on one and watch on another.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Final

import anyio
import msgspec

__all__ = ["Change", "Key", "Mirror", "key_of", "version_of"]

Key = tuple[str, str]
"""``(namespace or "", name)``: the order lists and pages follow."""
HISTORY: Final = 4096


class Change(msgspec.Struct, frozen=True):
    seq: int
    version: int
    type: str
    """``ADDED``, ``MODIFIED`` or ``DELETED``."""
    body: dict[str, Any]


def key_of(body: Mapping[str, Any]) -> Key | None:
    meta = body.get("metadata") or {}
    name = meta.get("name")
    return (str(meta.get("namespace") or ""), str(name)) if name else None


def version_of(body: Mapping[str, Any]) -> int | None:
    """The body's resourceVersion as a number (None when absent or not a number)."""
    text = str((body.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


class Mirror:
    """The objects of one resource as served (see the module docstring)."""

    def __init__(self, *, history: int = HISTORY) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.version = 0
        self.ready = False
        """Set once the source's first full state is in (until then the group is not served)."""
        self._history: deque[Change] = deque(maxlen=history)
        self._floor = 0
        """The oldest resourceVersion a watch may resume from (events after it are all kept)."""
        self._seq = 0
        self._changed = anyio.Event()

    @property
    def seq(self) -> int:
        """The sequence number of the last change (a new watcher's cursor)."""
        return self._seq

    def put(self, kind: str, body: dict[str, Any], version: int | None = None) -> None:
        """One change of one object (``version``: when it happened; default the body's)."""
        key = key_of(body)
        if key is None or kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        at = max(version or version_of(body) or self.version + 1, self.version)
        if kind == "DELETED":
            if self.objects.pop(key, None) is None:
                return
        else:
            kind = "MODIFIED" if key in self.objects else "ADDED"
            self.objects[key] = body
        self._record(kind, body, at)

    def replace(self, bodies: Iterable[dict[str, Any]], version: int | None = None) -> None:
        """A full state: what differs from the held one becomes changes (a key no longer there
        is DELETED at ``version``), then the mirror is ready."""
        fresh = {k: b for b in bodies if (k := key_of(b)) is not None}
        at = version if version is not None else self.version + 1
        for key in sorted(self.objects.keys() - fresh.keys()):
            self.put("DELETED", self.objects[key], at)
        for key in sorted(fresh):
            held = self.objects.get(key)
            if held is None or held != fresh[key]:
                self.put("MODIFIED" if held else "ADDED", fresh[key], version_of(fresh[key]) or at)
        self.advance(at)
        if not self.ready:
            self._floor = self.version
            self.ready = True
            self._wake()

    def advance(self, version: int) -> None:
        """The source has seen everything up to ``version`` (a list or a bookmark)."""
        if version > self.version:
            self.version = version
            self._wake()

    def since(self, version: int) -> list[Change] | None:
        """The changes after ``version``; None when the history no longer covers it."""
        if version < self._floor:
            return None
        return [c for c in self._history if c.version > version]

    def after(self, seq: int) -> list[Change]:
        """The changes after cursor ``seq``."""
        if not self._history or self._history[-1].seq <= seq:
            return []
        return [c for c in self._history if c.seq > seq]

    async def wait(self, seq: int) -> None:
        """Until there is a change after cursor ``seq`` or the version moves."""
        if self._seq > seq:
            return
        await self._changed.wait()

    def _record(self, kind: str, body: dict[str, Any], at: int) -> None:
        if len(self._history) == self._history.maxlen:
            self._floor = max(self._floor, self._history[0].version)
        self._seq += 1
        self.version = max(self.version, at)
        self._history.append(Change(self._seq, at, kind, body))
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

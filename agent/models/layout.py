"""The on-disk cache: a versioned directory layout and its small JSON records.

::

    <root>/layout                       "gpustack-model-store v1" (anything else: refuse to open)
    <root>/published/<hex>/marker       JSON, fsynced before the rename that publishes
    <root>/published/<hex>/manifest     the canonical manifest text the tree was verified against
    <root>/published/<hex>/tree/...     read-only files (0444, dirs 0555): the bind-mount source
    <root>/partial/<hex>/<n>/tree/...   attempt ``n`` being downloaded (0644/0755)
    <root>/partial/<hex>/<n>/state/<sha256(path)>  per-file resume state
    <root>/trash/<hex>-<ns>             removal staging, emptied on open
    <root>/ledger/refs/<volumeID>.json  one per published volume
    <root>/ledger/digests/<hex>.json    last use and failure/backoff of a digest
    <root>/ledger/policy.json           the last policy synced from the bus (agent.models.policyfile)

Invariants: a ``published/<hex>`` directory is complete and verified, because it only ever
appears by one ``rename`` of a finished attempt; records are replaced atomically (write a
temporary file of its own name, fsync, rename, fsync the directory), so concurrent writers never
share a temporary file; a digest record's read-modify-write runs under that digest's lock
(:meth:`Cache.update_digest`), so concurrent updates never lose one another. Everything here is
synchronous file I/O; the async layer calls it through a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

import msgspec

from agent.models.errors import CacheCorrupt, CacheUnusable
from kit import files

__all__ = ["Backoff", "Cache", "DigestRecord", "Marker", "Ref"]

LAYOUT: Final = "gpustack-model-store v1"
VOLUME_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
HEX: Final = re.compile(r"[0-9a-f]{64}")


class Marker(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    digest: str
    attempt: int
    manifest_format: str = "gpustack-manifest v1"
    size_bytes: int
    file_count: int
    published_time: datetime
    source: Literal["Hub", "Peer"] = "Hub"
    """Where most of its bytes came from (a marker written before peers existed: the Hub)."""


class Ref(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A volume published from the cache: what keeps a tree from being collected."""

    volume_id: str
    target_path: str
    hex: str
    artifact: str | None = None
    artifact_uid: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None


class Backoff(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The last failure of one source and credential (see :mod:`agent.models.backoff`)."""

    reason: str
    message: str = ""
    failures: int = 1
    """Consecutive failures: the delay doubles with each."""
    retry_at: float
    """Unix time before which no new attempt of this key starts."""
    permanent: bool = False
    """The cause does not change for the pinned commit: answered as a terminal failure."""


class DigestRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Per-digest history; survives restarts so a backoff does too.

    ``failures`` to ``retry_at`` are the latest failure, what the node reports; ``backoffs``
    is what holds back a new attempt, by source and credential.
    """

    last_used: float = 0.0
    """Unix time of the last mount or unmount (collection removes the oldest first)."""
    last_attempt: int = 0
    failures: int = 0
    reason: str | None = None
    message: str | None = None
    retry_at: float | None = None
    """Unix time of the next attempt after the latest failure."""
    backoffs: dict[str, Backoff] = msgspec.field(default_factory=dict)
    """``<repository>@<commit>#<credential>`` (or ``*``: any) -> its last failure."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace a cache record with ``data``, readable by the node's other readers (0644)."""
    files.write_atomically(path, data, mode=0o644)


def _ours_before_layout(path: Path) -> bool:
    """What an empty root may hold before its layout file exists: the filesystem's
    ``lost+found``, or the temporary file of our own layout write killed before its rename (a
    pull killed at that moment must not leave a root that every later pull refuses)."""
    return path.name == "lost+found" or (
        path.name.startswith(".layout.") and path.name.endswith(".tmp") and path.is_file()
    )


class Cache:
    """Paths and records under one cache root; :meth:`open` checks or creates the layout."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.published = root / "published"
        self.partial = root / "partial"
        self.trash = root / "trash"
        self.refs = root / "ledger" / "refs"
        self.digests = root / "ledger" / "digests"
        self._guard = threading.Lock()
        self._digest_locks: weakref.WeakValueDictionary[str, threading.Lock] = (
            weakref.WeakValueDictionary()
        )

    @classmethod
    def open(cls, root: Path) -> Cache:
        """Open (creating when empty) the cache at ``root`` and empty its trash.

        :raises CacheCorrupt: the root holds another layout version.
        :raises CacheUnusable: the root cannot be made or written (the reason in words).
        """
        try:
            return cls._open(root)
        except OSError as e:
            raise CacheUnusable(files.reason(e)) from e

    @classmethod
    def _open(cls, root: Path) -> Cache:
        cache = cls(root)
        root.mkdir(parents=True, exist_ok=True)
        layout = root / "layout"
        if layout.exists():
            found = layout.read_text(errors="replace").strip()
            if found != LAYOUT:
                raise CacheCorrupt(f"{root}: layout {found[:40]!r} is not {LAYOUT!r}; refusing")
        elif any(not _ours_before_layout(p) for p in root.iterdir()):
            raise CacheCorrupt(f"{root}: not empty and has no layout file; refusing to use it")
        else:
            for torn in root.glob(".layout.*.tmp"):  # a creation killed before its rename
                torn.unlink(missing_ok=True)
            write_atomically(layout, (LAYOUT + "\n").encode())
        for d in (cache.published, cache.partial, cache.trash, cache.refs, cache.digests):
            d.mkdir(parents=True, exist_ok=True)
        cache.empty_trash()
        return cache

    # ------------------------------------------------------------------ trees

    def tree(self, hex_: str) -> Path:
        return self.published / hex_ / "tree"

    def is_published(self, hex_: str) -> bool:
        return (self.published / hex_ / "marker").is_file()

    def marker(self, hex_: str) -> Marker | None:
        try:
            return msgspec.json.decode((self.published / hex_ / "marker").read_bytes(), type=Marker)
        except (OSError, msgspec.DecodeError):
            return None

    def published_hexes(self) -> list[str]:
        return sorted(p.name for p in self.published.iterdir() if HEX.fullmatch(p.name))

    def partial_hexes(self) -> list[str]:
        return sorted(p.name for p in self.partial.iterdir() if HEX.fullmatch(p.name))

    def attempts(self, hex_: str) -> list[int]:
        d = self.partial / hex_
        if not d.is_dir():
            return []
        return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())

    def new_attempt(self, hex_: str, number: int) -> Path:
        """Directory of attempt ``number``; the latest earlier attempt is renamed in to resume."""
        base = self.partial / hex_
        base.mkdir(parents=True, exist_ok=True)
        target = base / str(number)
        earlier = [n for n in self.attempts(hex_) if n < number]
        if earlier and not target.exists():
            (base / str(earlier[-1])).rename(target)
            with contextlib.suppress(FileNotFoundError):
                (target / "marker").unlink()
            _unseal(target)
        for n in earlier[:-1]:
            self.discard(base / str(n))
        (target / "tree").mkdir(parents=True, exist_ok=True)
        (target / "state").mkdir(parents=True, exist_ok=True)
        return target

    def partial_bytes(self, hex_: str) -> int:
        return _du(self.partial / hex_)

    def size_of(self, hex_: str) -> int:
        m = self.marker(hex_)
        return m.size_bytes if m is not None else _du(self.published / hex_)

    # ------------------------------------------------------------------ removal

    def discard(self, path: Path) -> None:
        """Move ``path`` into the trash (atomic, instant) and delete it from there."""
        if not path.exists():
            return
        dest = self.trash / f"{path.name}-{time.time_ns()}"
        _unseal(path)
        path.rename(dest)
        _rmtree(dest)

    def remove(self, hex_: str) -> None:
        """Remove a published tree and any partial of ``hex_``."""
        self.discard(self.published / hex_)
        self.discard(self.partial / hex_)

    def empty_trash(self) -> None:
        for p in self.trash.iterdir():
            _unseal(p)
            _rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ records

    def load_refs(self) -> dict[str, Ref]:
        refs: dict[str, Ref] = {}
        for p in self.refs.glob("*.json"):
            try:
                ref = msgspec.json.decode(p.read_bytes(), type=Ref)
            except (OSError, msgspec.DecodeError):
                p.unlink(missing_ok=True)  # a torn or foreign file: mountinfo rebuilds the truth
                continue
            refs[ref.volume_id] = ref
        return refs

    def save_ref(self, ref: Ref) -> None:
        write_atomically(self.refs / f"{ref.volume_id}.json", msgspec.json.encode(ref))

    def drop_ref(self, volume_id: str) -> None:
        (self.refs / f"{volume_id}.json").unlink(missing_ok=True)

    def load_digest(self, hex_: str) -> DigestRecord:
        try:
            return msgspec.json.decode(
                (self.digests / f"{hex_}.json").read_bytes(), type=DigestRecord
            )
        except (OSError, msgspec.DecodeError):
            return DigestRecord()

    def save_digest(self, hex_: str, record: DigestRecord) -> None:
        with self._digest_lock(hex_):
            write_atomically(self.digests / f"{hex_}.json", msgspec.json.encode(record))

    def update_digest(
        self, hex_: str, change: Callable[[DigestRecord], DigestRecord]
    ) -> DigestRecord:
        """Load, ``change`` and save ``hex_``'s record as one step; returns what was saved.

        Jobs, mounts and unmounts of one digest update its record from different threads; a
        plain load-then-save would drop a failure (and its backoff) written in between.
        """
        with self._digest_lock(hex_):
            record = change(self.load_digest(hex_))
            write_atomically(self.digests / f"{hex_}.json", msgspec.json.encode(record))
        return record

    def _digest_lock(self, hex_: str) -> threading.Lock:
        """The lock of ``hex_``'s record; kept only while someone holds a reference to it."""
        with self._guard:
            lock = self._digest_locks.get(hex_)
            if lock is None:
                lock = threading.Lock()
                self._digest_locks[hex_] = lock
            return lock

    def digest_hexes(self) -> list[str]:
        return sorted(p.stem for p in self.digests.glob("*.json") if HEX.fullmatch(p.stem))

    # ------------------------------------------------------------------ capacity

    def usage(self) -> tuple[int, int]:
        """(used, total) bytes of the cache's filesystem; root-reserved blocks count as used."""
        st = os.statvfs(self.root)
        total = st.f_blocks * st.f_frsize
        return total - st.f_bavail * st.f_frsize, total


def state_name(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()


def _unseal(path: Path) -> None:
    """Make a (possibly read-only) tree writable again so it can be renamed or deleted."""
    if not path.is_dir():
        return
    for dirpath, dirnames, _ in os.walk(path):
        os.chmod(dirpath, 0o755)
        for d in dirnames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, d), 0o755)


def _du(path: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _rmtree(path: Path) -> None:
    """``shutil.rmtree``, ignoring errors; :mod:`shutil` (and the compression modules it
    imports) only when a tree is deleted, not at every ``mm pull``'s start."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)

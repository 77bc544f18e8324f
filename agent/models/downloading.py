"""Download one manifest file into an attempt directory, verifying it while it streams.

Per file: a preallocated destination (a full disk fails here, before any byte is fetched), then
byte-range segments of :attr:`Tuning.segment_bytes` (a small file is one segment), at most
:attr:`Tuning.window` in flight in file order. The hash runs in file order behind a *frontier*:
bytes that arrive at the frontier are hashed straight from memory; bytes of a segment that ran
ahead are hashed from the file when the frontier reaches them (the only reads, and each byte is
read at most once). A server that ignores ``Range`` gets one sequential stream instead.

Resume: every :attr:`Tuning.checkpoint_bytes`, and when interrupted or cancelled, the file is
fsynced and the written length of each segment saved to ``state/<sha256(path)>``; the next attempt
continues each segment from there (rehashing the kept bytes once, since a hash state cannot be
saved). A verified file's state says ``verified`` and is never fetched again.

Invariants: a file whose hash or size differs is deleted with its state and raises
:class:`IntegrityMismatch`; memory per stream is bounded by ``chunk_bytes``.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiofiles
import anyio
import anyio.to_thread
import msgspec

from agent.models.errors import NoSpace
from agent.models.tuning import Tuning
from hub import client as hub_client
from hub.errors import IntegrityMismatch, SourceUnavailable
from hub.manifest import Entry

__all__ = ["Limits", "Origin", "fetch"]


class Limits:
    """Node-wide download limits: HTTP requests in flight and a token-bucket byte rate."""

    def __init__(self, concurrency: int, bytes_per_second: int) -> None:
        self.requests = anyio.CapacityLimiter(concurrency)
        self.rate = bytes_per_second
        self._tokens = 0.0
        self._stamp = anyio.current_time() if _in_loop() else 0.0

    def update(self, concurrency: int, bytes_per_second: int) -> None:
        self.requests.total_tokens = concurrency
        self.rate = bytes_per_second

    async def take(self, n: int) -> None:
        """Wait until ``n`` bytes may be received (no wait when unlimited)."""
        if self.rate <= 0:
            return
        bucket = max(self.rate, 32 * 1024)
        now = anyio.current_time()
        self._tokens = min(bucket, self._tokens + (now - self._stamp) * self.rate) - n
        self._stamp = now
        if self._tokens < 0:
            await anyio.sleep(-self._tokens / self.rate)


def _in_loop() -> bool:
    try:
        anyio.current_time()
    except RuntimeError:
        return False
    return True


@dataclass(frozen=True)
class Origin:
    """Where the bytes of a manifest come from."""

    hub: hub_client.HubClient
    repository: str
    commit: str
    token: str | None


class _State(msgspec.Struct):
    size: int
    written: list[int]
    """Per segment, bytes written (and fsynced) from its start."""
    verified: bool = False


class _NoRanges(Exception):
    """The server answered a ranged request with the whole file."""


class _Assembly:
    """One file being written by several segments and hashed in order behind a frontier."""

    def __init__(self, entry: Entry, dest: Path, bounds: list[tuple[int, int]]) -> None:
        self.entry = entry
        self.dest = dest
        self.bounds = bounds
        self.written = [0] * len(bounds)
        self.frontier = 0
        self.hasher: Any = hashlib.sha256() if entry.algorithm == "sha256" else hashlib.sha1()
        if entry.algorithm == "gitsha1":
            self.hasher.update(b"blob %d\0" % entry.size)
        self.lock = anyio.Lock()

    def _ahead(self) -> int:
        """Bytes written at the frontier that are not hashed yet."""
        for i, (start, end) in enumerate(self.bounds):
            if start <= self.frontier < end:
                return start + self.written[i] - self.frontier
        return 0

    async def arrived(self, offset: int, chunk: bytes, chunk_bytes: int) -> None:
        """Hash what can be hashed now; call after ``chunk`` was written at ``offset``."""
        if self.lock.locked():
            return  # the holder's catch-up loop will read these bytes from the file
        async with self.lock:
            if offset == self.frontier:
                await anyio.to_thread.run_sync(self.hasher.update, chunk)
                self.frontier += len(chunk)
            await self._catch_up(chunk_bytes)

    async def _catch_up(self, chunk_bytes: int) -> None:
        if self._ahead() <= 0:
            return
        async with _opened(self.dest, "rb") as f:
            while (n := min(self._ahead(), chunk_bytes)) > 0:
                await f.seek(self.frontier)
                data = await f.read(n)
                if not data:
                    raise SourceUnavailable(f"{self.entry.path}: file shorter than written")
                await anyio.to_thread.run_sync(self.hasher.update, data)
                self.frontier += len(data)

    async def finish(self, chunk_bytes: int) -> None:
        async with self.lock:
            await self._catch_up(chunk_bytes)
        if self.frontier != self.entry.size:
            raise IntegrityMismatch(f"{self.entry.path}: got {self.frontier} of {self.entry.size}")
        if self.hasher.hexdigest() != self.entry.oid:
            raise IntegrityMismatch(
                f"{self.entry.path}: content does not match its {self.entry.algorithm}"
            )


def _bounds(size: int, segment: int) -> list[tuple[int, int]]:
    if size == 0:
        return [(0, 0)]
    return [(s, min(s + segment, size)) for s in range(0, size, segment)]


def _load_state(path: Path, size: int, segments: int, dest: Path) -> _State | None:
    if not dest.is_file():
        return None
    try:
        state = msgspec.json.decode(path.read_bytes(), type=_State)
    except (OSError, msgspec.DecodeError):
        return None
    if state.size != size or len(state.written) != segments:
        return None
    return state


def _prepare(dest: Path, size: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if size:
            os.posix_fallocate(fd, 0, size)
        os.ftruncate(fd, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace(f"no space for {size} bytes in the cache") from e
        raise
    finally:
        os.close(fd)


def _checkpoint(dest: Path, state_path: Path, state: _State) -> None:
    fd = os.open(dest, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp = state_path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(state))
    tmp.replace(state_path)


def _forget(dest: Path, state_path: Path) -> None:
    dest.unlink(missing_ok=True)
    state_path.unlink(missing_ok=True)


@asynccontextmanager
async def _opened(path: Path, mode: Literal["rb", "r+b"]) -> AsyncIterator[Any]:
    """An aiofiles handle whose open and close cannot be cut by a cancellation.

    A cancelled ``await aiofiles.open`` leaves the file the worker thread opened unowned.
    """
    with anyio.CancelScope(shield=True):
        # Unbuffered: a byte counted as written is in the OS file, where the hashing
        # catch-up (another handle) reads it; a userspace buffer would hide it.
        f = await aiofiles.open(path, mode, buffering=0)
    try:
        yield f
    finally:
        with anyio.CancelScope(shield=True):
            await f.close()


@contextmanager
def first_error() -> Iterator[None]:
    """Unwrap a task group's ExceptionGroup into its first real error (the one that stopped it).

    Cancellations are never unwrapped (their group is re-raised as is), so cancel scopes keep
    working and no exception context cycle is created.
    """
    try:
        yield
    except BaseExceptionGroup as eg:
        cancelled = anyio.get_cancelled_exc_class()
        _, rest = eg.split(cancelled)
        if rest is None:
            raise
        leaf: BaseException = rest
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise leaf from eg


async def fetch(
    origin: Origin,
    entry: Entry,
    dest: Path,
    state_path: Path,
    *,
    limits: Limits,
    tuning: Tuning,
    progress: Callable[[int], None],
) -> None:
    """Make ``dest`` hold ``entry``'s verified bytes (resuming what is there).

    :raises HubError: refused, unavailable after retries, or an integrity mismatch (then the
        file and its state are gone). :raises NoSpace: the cache filesystem is full.
    """
    job = _FileFetch(origin, entry, dest, state_path, limits, tuning, progress)
    bounds = _bounds(entry.size, tuning.segment_bytes)
    state = await anyio.to_thread.run_sync(_load_state, state_path, entry.size, len(bounds), dest)
    if state is not None and state.verified:
        return
    if state is None:
        state = _State(entry.size, [0] * len(bounds))
        await anyio.to_thread.run_sync(_prepare, dest, entry.size)
    try:
        await job.run(state, bounds, ranged=True)
    except _NoRanges:
        await job.run(_State(entry.size, [0]), [(0, entry.size)], ranged=False)


@dataclass
class _FileFetch:
    origin: Origin
    entry: Entry
    dest: Path
    state_path: Path
    limits: Limits
    tuning: Tuning
    progress: Callable[[int], None]

    async def run(self, state: _State, bounds: list[tuple[int, int]], *, ranged: bool) -> None:
        asm = _Assembly(self.entry, self.dest, bounds)
        asm.written = state.written
        self._state, self._since, self._saving = state, 0, anyio.Lock()
        window = anyio.Semaphore(self.tuning.window)
        try:
            with first_error():
                async with anyio.create_task_group() as tg:
                    for i in range(len(bounds)):
                        await window.acquire()  # segments start in file order, `window` at once
                        tg.start_soon(self._segment, asm, i, window, ranged)
            await asm.finish(self.tuning.chunk_bytes)
        except IntegrityMismatch:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_forget, self.dest, self.state_path)
            raise
        except BaseException:
            await self._save()
            raise
        state.verified = True
        await self._save()

    async def _save(self) -> None:
        with anyio.CancelScope(shield=True):
            async with self._saving:
                await anyio.to_thread.run_sync(_checkpoint, self.dest, self.state_path, self._state)

    async def _moved(self, n: int) -> None:
        self.progress(n)
        self._since += n
        if self._since >= self.tuning.checkpoint_bytes and not self._saving.locked():
            self._since = 0
            await self._save()

    async def _segment(self, asm: _Assembly, i: int, window: anyio.Semaphore, ranged: bool) -> None:
        """Fetch segment ``i`` to its end, retrying from the last written byte."""
        start, end = asm.bounds[i]
        failures = 0
        try:
            while start + asm.written[i] < end:
                before = asm.written[i]
                try:
                    async with self.limits.requests:
                        await self._stream(asm, i, ranged)
                except SourceUnavailable:
                    failures = 0 if asm.written[i] > before else failures + 1
                    if failures > self.tuning.retries:
                        raise
                    await anyio.sleep(min(self.tuning.retry_delay_s * max(failures, 1), 10.0))
        finally:
            window.release()

    async def _stream(self, asm: _Assembly, i: int, ranged: bool) -> None:
        start, end = asm.bounds[i]
        pos = start + asm.written[i]
        whole = not ranged or (pos == 0 and end == self.entry.size)
        async with self.origin.hub.download(
            self.origin.repository,
            self.origin.commit,
            self.entry.path,
            token=self.origin.token,
            start=0 if whole else pos,
            end=None if whole else end,
        ) as body:
            if body.start != (0 if whole else pos):
                raise _NoRanges
            if body.total is not None and body.total != self.entry.size:
                raise IntegrityMismatch(
                    f"{self.entry.path}: the server says {body.total} bytes, the manifest "
                    f"{self.entry.size}"
                )
            await self._copy(asm, i, body, pos, skip=pos if whole else 0)

    async def _copy(
        self, asm: _Assembly, i: int, body: hub_client.Body, pos: int, *, skip: int
    ) -> None:
        """Write (and hash) the body from ``pos``; ``skip``: leading bytes already written."""
        end = asm.bounds[i][1]
        async with _opened(asm.dest, "r+b") as f:
            await f.seek(pos)
            async for piece in _buffered(body, self.tuning.chunk_bytes):
                chunk = piece[skip:][: end - pos]
                skip = max(0, skip - len(piece))
                if not chunk:
                    continue
                await self.limits.take(len(chunk))
                await _write(f, chunk)
                asm.written[i] += len(chunk)
                await self._moved(len(chunk))
                await asm.arrived(pos, chunk, self.tuning.chunk_bytes)
                pos += len(chunk)
                if pos >= end:
                    return
        raise SourceUnavailable(f"{self.entry.path}: the response ended at byte {pos} of {end}")


async def _write(f: Any, chunk: bytes) -> None:
    """Write all of ``chunk`` (an unbuffered write may take only part of it)."""
    view = memoryview(chunk)
    try:
        while view:
            n = await f.write(view)
            view = view[n:]
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace("the cache filesystem is full") from e
        raise


async def _buffered(body: hub_client.Body, size: int) -> AsyncIterator[bytes]:
    """Group the network's small reads into ``size``-byte chunks (one write and hash each)."""
    buf = bytearray()
    async for piece in body.chunks(size):
        if not buf and len(piece) >= size:
            yield piece  # already big enough: no copy
            continue
        buf += piece
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)

"""Download one manifest file into an attempt directory, verifying it while it streams.

A file of at most :attr:`Tuning.small_bytes` is fetched whole by one request and landed by
one worker-thread call, with no resume state (:class:`_Whole`, :mod:`agent.models.diskio`).

Per larger file: a preallocated destination (a full disk fails here, before any byte is
fetched), then byte-range segments of :attr:`Tuning.segment_bytes`, at most
:attr:`Tuning.window` in flight in file order. The hash runs in file order behind a *frontier*:
bytes that arrive at the frontier are hashed straight from memory; bytes of a segment that ran
ahead are hashed from the file when the frontier reaches them (the only reads, and each byte is
read at most once). A server that ignores ``Range`` gets one sequential stream instead.

Durability while downloading: every :attr:`Tuning.sync_behind_bytes` written, the file is
fdatasynced by a worker thread behind the writers (:class:`assembling.SyncBehind`), so the fsync before
publication has little left to wait for.

Resume: every :attr:`Tuning.checkpoint_bytes`, and when interrupted or cancelled, the file is
fsynced and the written length of each segment saved to ``state/<sha256(path)>``; the next attempt
continues each segment from there (rehashing the kept bytes once, since a hash state cannot be
saved). A verified file's state says ``verified`` and is never fetched again.

Bytes are copied once, from the socket buffer to the page cache: the network's pieces are
gathered (never joined) into batches of about :attr:`Tuning.chunk_bytes` and each batch is
written with one ``pwritev`` and, at the frontier, hashed in the same worker-thread call (both
release the GIL), so the event loop keeps receiving while a batch is stored.

Invariants: a file whose hash or size differs is deleted with its state and raises
:class:`IntegrityMismatch`; memory per stream is bounded by ``chunk_bytes``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread

from agent.models import assembling, diskio
from agent.models.tuning import Tuning
from hub import client as hub_client
from hub.errors import IntegrityMismatch, SourceUnavailable
from hub.manifest import Entry

__all__ = ["Files", "Limits", "Origin", "fetch"]


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

    async def begin_request(self) -> None:
        """Take a request slot (give it back with :meth:`end_request`): at once when one is
        free, without the loop turn anyio's ``acquire`` takes even then (a cancel-shielded
        checkpoint and a cancel scope: per small file, a pull of thousands paid it for each);
        otherwise wait for one as ``acquire`` does."""
        try:
            self.requests.acquire_nowait()
        except anyio.WouldBlock:
            await self.requests.acquire()

    def end_request(self) -> None:
        self.requests.release()

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


class Files(Protocol):
    """What serves a manifest's file bytes: the Hub (:class:`hub.client.HubClient`) or a peer
    model agent (:class:`agent.models.peerclient.PeerFiles`); the verification here is the same
    for both, so a peer is trusted for nothing but availability."""

    def download(
        self,
        repository: str,
        commit: str,
        path: str,
        *,
        token: str | None,
        start: int = 0,
        end: int | None = None,
    ) -> AbstractAsyncContextManager[hub_client.Body]: ...

    async def whole(
        self, repository: str, commit: str, path: str, *, token: str | None, size: int
    ) -> list[bytes | memoryview]: ...


@dataclass(frozen=True)
class Origin:
    """Where the bytes of a manifest come from."""

    hub: Files
    repository: str
    commit: str
    token: str | None


class _NoRanges(Exception):
    """The server answered a ranged request with the whole file."""


def _bounds(size: int, segment: int) -> list[tuple[int, int]]:
    if size == 0:
        return [(0, 0)]
    return [(s, min(s + segment, size)) for s in range(0, size, segment)]


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
    present: bool = True,
) -> None:
    """Make ``dest`` hold ``entry``'s verified bytes (resuming what is there); not durable yet:
    publication's seal fsyncs every file (see :mod:`agent.models.diskio`).

    ``present=False``: the caller knows ``dest`` does not exist (it listed the attempt), so a
    small file skips looking for one (a worker-thread call).

    :raises HubError: refused, unavailable after retries, or an integrity mismatch (then the
        file and its state are gone). :raises NoSpace: the cache filesystem is full.
    """
    if entry.size <= tuning.small_bytes:
        whole = _Whole(origin, entry, dest, state_path, limits, tuning, progress)
        await whole.run(present)
        return
    job = _FileFetch(origin, entry, dest, state_path, limits, tuning, progress)
    bounds = _bounds(entry.size, tuning.segment_bytes)
    state, _ = await anyio.to_thread.run_sync(
        assembling.start, state_path, dest, entry.size, len(bounds)
    )
    if not state.verified:
        try:
            await job.run(state, bounds, ranged=True)
        except _NoRanges:
            await job.run(assembling.State(entry.size, [0]), [(0, entry.size)], ranged=False)


@dataclass
class _Job:
    """One file to fetch: where from, where to, and the node-wide limits it shares."""

    origin: Origin
    entry: Entry
    dest: Path
    state_path: Path
    limits: Limits
    tuning: Tuning
    progress: Callable[[int], None]


@dataclass
class _Whole(_Job):
    """A small file: one request, the body held in memory (at most ``small_bytes``), then one
    worker-thread call writes, hashes and closes it (:func:`diskio.land`); no resume state, and
    no fsync until publication's seal (see :mod:`agent.models.diskio`).
    A cut response is asked again whole, as a segment would be resumed."""

    async def run(self, present: bool) -> None:
        entry, tuning = self.entry, self.tuning
        if present and await anyio.to_thread.run_sync(
            diskio.kept, self.dest, entry, tuning.chunk_bytes
        ):
            return
        failures = 0
        while True:
            await self.limits.begin_request()
            try:
                body = await _whole_body(self.origin, entry, self.limits)
            except SourceUnavailable:
                failures += 1
                if failures > tuning.retries:
                    raise
            else:
                break
            finally:
                self.limits.end_request()  # before the retry's wait, as ever
            await anyio.sleep(min(tuning.retry_delay_s * failures, 10.0))
        if not await anyio.to_thread.run_sync(diskio.land, self.dest, entry, body):
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(assembling.forget, self.dest, self.state_path)
            raise IntegrityMismatch(f"{entry.path}: content does not match its {entry.algorithm}")
        self.progress(entry.size)


async def _whole_body(origin: Origin, entry: Entry, limits: Limits) -> list[memoryview]:
    """All of ``entry``'s bytes from one plain GET, as the network's pieces (never joined).

    :raises SourceUnavailable: the response ended short (the caller asks again).
    """
    if entry.size == 0:
        return []
    pieces = await origin.hub.whole(
        origin.repository, origin.commit, entry.path, token=origin.token, size=entry.size
    )
    await limits.take(entry.size)  # at most small_bytes: the same step as a large file's batch
    return [memoryview(p) for p in pieces]


@dataclass
class _FileFetch(_Job):
    """A file fetched in ranged segments (one stream when the server ignores ``Range``)."""

    async def run(
        self, state: assembling.State, bounds: list[tuple[int, int]], *, ranged: bool
    ) -> None:
        asm = assembling.Assembly(self.entry, self.dest, bounds)
        asm.written = state.written
        self._state, self._since, self._saving = state, 0, anyio.Lock()
        window = anyio.Semaphore(self.tuning.window)
        try:
            async with assembling.synced_behind(
                self.dest, self.tuning.sync_behind_bytes
            ) as self._behind:
                with first_error():
                    async with anyio.create_task_group() as tg:
                        for i in range(len(bounds)):
                            await window.acquire()  # segments start in file order
                            tg.start_soon(self._segment, asm, i, window, ranged)
            await asm.finish(self.tuning.chunk_bytes)
        except IntegrityMismatch:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(assembling.forget, self.dest, self.state_path)
            raise
        except BaseException:
            await self._save()
            raise
        state.verified = True
        await self._save()

    async def _save(self) -> None:
        with anyio.CancelScope(shield=True):
            async with self._saving:
                await anyio.to_thread.run_sync(
                    assembling.checkpoint, self.dest, self.state_path, self._state
                )

    async def _moved(self, n: int) -> None:
        self.progress(n)
        self._behind.wrote(n)
        self._since += n
        if self._since >= self.tuning.checkpoint_bytes and not self._saving.locked():
            self._since = 0
            await self._save()

    async def _segment(
        self, asm: assembling.Assembly, i: int, window: anyio.Semaphore, ranged: bool
    ) -> None:
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

    async def _stream(self, asm: assembling.Assembly, i: int, ranged: bool) -> None:
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
        self, asm: assembling.Assembly, i: int, body: hub_client.Body, pos: int, *, skip: int
    ) -> None:
        """Write (and hash) the body from ``pos``; ``skip``: leading bytes already written."""
        end = asm.bounds[i][1]
        async with assembling.opened(asm.dest) as fd:
            async for batch in _batches(body, self.tuning.chunk_bytes, skip, end - pos):
                n = sum(len(v) for v in batch)
                await self.limits.take(n)
                if asm.claim(pos):
                    try:
                        await anyio.to_thread.run_sync(diskio.store, fd, batch, pos, asm.hasher)
                    except BaseException:
                        asm.lock.release()
                        raise
                    asm.written[i] += n
                    await asm.advanced(n, self.tuning.chunk_bytes)
                else:
                    await anyio.to_thread.run_sync(diskio.store, fd, batch, pos, None)
                    asm.written[i] += n
                    await asm.arrived(self.tuning.chunk_bytes)
                await self._moved(n)
                pos += n
                if pos >= end:
                    return
        raise SourceUnavailable(f"{self.entry.path}: the response ended at byte {pos} of {end}")


async def _batches(
    body: hub_client.Body, size: int, skip: int, limit: int
) -> AsyncIterator[list[memoryview]]:
    """The body's pieces as views, ``skip`` bytes dropped and at most ``limit`` kept, grouped
    into batches of about ``size`` bytes (one write and hash each; no byte is copied)."""
    batch: list[memoryview] = []
    held = 0
    async for piece in body.pieces():
        view = memoryview(piece)
        if skip:
            cut, skip = min(skip, len(view)), skip - min(skip, len(view))
            view = view[cut:]
        view = view[:limit]
        if not view:
            continue
        limit -= len(view)
        batch.append(view)
        held += len(view)
        if held >= size or not limit:
            yield batch
            batch, held = [], 0
        if not limit:
            return
    if batch:
        yield batch

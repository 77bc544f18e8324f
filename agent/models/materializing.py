"""Materialization: turn a manifest digest into a published, verified, read-only tree, once.

One job per digest at a time; every volume asking for that digest while it runs *joins* it
(its source is added; a token is only ever used for its own repository, the latest one wins).
:meth:`Materializer.ensure` never waits for bytes: it starts or joins the job and raises
:class:`Materializing` with the progress, or :class:`BackingOff` while a failure's backoff runs,
so NodePublishVolume answers within a kubelet timeout and kubelet retries.

An attempt: list the files at the pinned commit (the digest must match, else
IntegrityMismatch), reserve capacity, download all files (:mod:`agent.models.downloading`),
then publish: chmod files 0444 and directories 0555, fsync, write the marker, fsync, and
``rename(partial/<hex>/<n>, published/<hex>)`` — one atomic step, so a reader sees either no
tree or a complete one. A failure is recorded with a backoff (1 min doubling to 1 h, in the
ledger, so it survives restarts); ``InvalidRequest`` and ``Canceled`` do not back off.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from agent.models import downloading, layout
from agent.models.errors import BackingOff, Materializing, NoSpace
from agent.models.metrics import ModelMetrics
from agent.models.settings import Tuning
from hub import client as hub_client
from hub import resolving
from hub.errors import AccessDenied, HubError, IntegrityMismatch
from hub.manifest import Manifest

__all__ = ["Job", "Materializer", "Source", "backoff_delay"]

log = logging.getLogger(__name__)
NO_BACKOFF = frozenset({"InvalidRequest", "Canceled"})


def backoff_delay(failures: int, *, first_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures: first_s, doubling, capped."""
    if failures <= 0:
        return 0.0
    return float(min(first_s * 2 ** min(failures - 1, 32), max_s))


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


@dataclass(frozen=True)
class Source:
    """Where a volume says the digest's bytes are (from its authorized ModelArtifact)."""

    repository: str
    commit: str
    token: str | None
    allow: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()


@dataclass
class Job:
    """A running attempt for one digest; what ``/model/downloads`` and the bus report."""

    hex: str
    sources: list[Source]
    started: float
    asked: float
    phase: str = "listing the files"
    size: int = 0
    done: int = 0
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def join(self, source: Source, now: float) -> None:
        """Add ``source``; a repository already listed only refreshes its token."""
        self.asked = now
        for i, s in enumerate(self.sources):
            if s.repository == source.repository:
                self.sources[i] = source
                return
        self.sources.append(source)

    def progress(self) -> str:
        if self.phase != "downloading":
            return f"materializing sha256:{self.hex[:12]}: {self.phase}"
        return (
            f"materializing sha256:{self.hex[:12]}: {human(self.done)} of {human(self.size)} "
            "received"
        )


Reserve = Callable[[str, int], Awaitable[None]]


class Materializer:
    """Owns the jobs; :meth:`run` is the task group they live in."""

    def __init__(
        self,
        cache: layout.Cache,
        hub: hub_client.HubClient,
        limits: downloading.Limits,
        *,
        tuning: Tuning,
        metrics: ModelMetrics,
        reserve: Reserve,
        changed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.hub = hub
        self.limits = limits
        self.tuning = tuning
        self.metrics = metrics
        self._reserve = reserve
        self.changed = changed
        self._clock = clock
        self.jobs: dict[str, Job] = {}
        self._tg: TaskGroup | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the jobs until cancelled; cancels attempts nobody asked about for too long."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            try:
                while True:
                    await anyio.sleep(min(30.0, self.tuning.waiter_window_s / 4))
                    now = self._clock()
                    for job in list(self.jobs.values()):
                        if now - job.asked > self.tuning.waiter_window_s:
                            log.info("sha256:%s: nobody waits for it, cancelling", job.hex[:12])
                            job.scope.cancel()
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    def remaining(self, hex_: str) -> int:
        """Bytes the running jobs other than ``hex_`` still have to write (for reservations)."""
        return sum(j.size - j.done for h, j in self.jobs.items() if h != hex_)

    def ensure(self, hex_: str, source: Source) -> None:
        """Start or join the job for ``hex_``; always raises while the tree is not published.

        :raises Materializing: running (the message has the progress).
        :raises BackingOff: the last attempt failed and the next is not due.
        """
        now = self._clock()
        job = self.jobs.get(hex_)
        if job is not None:
            job.join(source, now)
            raise Materializing(job.progress())
        record = self.cache.load_digest(hex_)
        if record.retry_at is not None and record.retry_at > now:
            when = datetime.fromtimestamp(record.retry_at, UTC).isoformat(timespec="seconds")
            raise BackingOff.of(
                f"materializing sha256:{hex_[:12]} failed, {record.reason}: {record.message}; "
                f"the next attempt starts at {when}",
                reason=record.reason or "SourceUnavailable",
            )
        if self._tg is None:
            raise BackingOff.of("the materializer is not running", reason="SourceUnavailable")
        job = Job(hex_, [source], started=now, asked=now)
        self.jobs[hex_] = job
        self._tg.start_soon(self._run_job, job, name=f"materialize-{hex_[:12]}")
        self.changed()
        raise Materializing(job.progress())

    async def _run_job(self, job: Job) -> None:
        reason, message = "Canceled", "nobody asked for it any more"
        try:
            with job.scope:
                await self._attempt(job)
                reason = ""
        except HubError as e:
            reason, message = e.reason, str(e)
        except NoSpace as e:
            reason, message = "InsufficientCapacity", str(e)
        except OSError as e:
            reason, message = "SourceUnavailable", f"cache I/O failed: {e}"
        finally:
            # Recorded before the job leaves ``jobs``: a report in between would otherwise see
            # neither the job nor its outcome, and publish the model as gone for one event.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._record, job.hex, reason, message)
            self.jobs.pop(job.hex, None)
            self.changed()

    def _record(self, hex_: str, reason: str, message: str) -> None:
        self.metrics.materializations.labels(result=reason or "published").inc()
        record = self.cache.load_digest(hex_)
        if not reason:
            record = msgspec.structs.replace(
                record,
                failures=0,
                reason=None,
                message=None,
                retry_at=None,
                last_used=self._clock(),
            )
        else:
            log.warning("sha256:%s: %s: %s", hex_[:12], reason, message)
            failures = record.failures + (0 if reason in NO_BACKOFF else 1)
            delay = backoff_delay(
                failures, first_s=self.tuning.backoff_first_s, max_s=self.tuning.backoff_max_s
            )
            retry = None if reason in NO_BACKOFF else self._clock() + delay
            record = msgspec.structs.replace(
                record, failures=failures, reason=reason, message=message[:512], retry_at=retry
            )
        self.cache.save_digest(hex_, record)

    async def _attempt(self, job: Job) -> None:
        record = await anyio.to_thread.run_sync(self.cache.load_digest, job.hex)
        number = record.last_attempt + 1
        await anyio.to_thread.run_sync(
            self.cache.save_digest, job.hex, msgspec.structs.replace(record, last_attempt=number)
        )
        attempt = await anyio.to_thread.run_sync(self.cache.new_attempt, job.hex, number)
        tried = 0
        while tried < len(job.sources):
            source = job.sources[tried]
            try:
                manifest = await self._download(job, source, attempt)
                break
            except AccessDenied:
                tried += 1
                if tried >= len(job.sources):
                    raise
        job.phase = "publishing"
        await anyio.to_thread.run_sync(_publish, self.cache, job.hex, number, attempt, manifest)
        self.metrics.publish_duration.observe(self._clock() - job.started)

    async def _download(self, job: Job, source: Source, attempt: Path) -> Manifest:
        job.phase = "listing the files"
        manifest = await resolving.listing(
            self.hub,
            source.repository,
            source.commit,
            token=source.token,
            allow=source.allow,
            ignore=source.ignore,
        )
        if manifest.digest != "sha256:" + job.hex:
            raise IntegrityMismatch(
                f"{source.repository}@{source.commit[:12]} lists {manifest.digest}, "
                f"not sha256:{job.hex}"
            )
        on_disk = await anyio.to_thread.run_sync(self.cache.partial_bytes, job.hex)
        job.size, job.done = manifest.size, 0
        await self._reserve(job.hex, max(0, manifest.size - on_disk))
        job.phase = "downloading"
        origin = downloading.Origin(self.hub, source.repository, source.commit, source.token)
        files = anyio.CapacityLimiter(self.tuning.files_per_attempt)

        def moved(n: int) -> None:
            job.done = min(job.size, job.done + n)
            self.metrics.download_bytes.labels(source="hub").inc(n)

        async def one(entry_index: int) -> None:
            entry = manifest.entries[entry_index]
            async with files:
                await downloading.fetch(
                    origin,
                    entry,
                    attempt / "tree" / entry.path,
                    attempt / "state" / layout.state_name(entry.path),
                    limits=self.limits,
                    tuning=self.tuning,
                    progress=moved,
                )

        with downloading.first_error():
            async with anyio.create_task_group() as tg:
                for i in range(len(manifest.entries)):
                    tg.start_soon(one, i)
        return manifest


def _publish(
    cache: layout.Cache, hex_: str, number: int, attempt: Path, manifest: Manifest
) -> None:
    """Seal ``attempt`` and rename it to ``published/<hex>`` (see the module docstring)."""
    state = attempt / "state"
    for p in state.iterdir():
        p.unlink()
    state.rmdir()
    tree = attempt / "tree"
    for e in manifest.entries:  # directories of empty repos still need to exist
        (tree / e.path).parent.mkdir(parents=True, exist_ok=True)
    layout.write_atomically(attempt / "manifest", manifest.text().encode())
    _seal(tree)
    marker = layout.Marker(
        digest="sha256:" + hex_,
        attempt=number,
        size_bytes=manifest.size,
        file_count=len(manifest.entries),
        published_time=datetime.now(UTC),
    )
    layout.write_atomically(attempt / "marker", msgspec.json.encode(marker))
    if cache.is_published(hex_):
        cache.discard(attempt)  # published by an earlier run meanwhile: same bytes, keep that one
        return
    cache.discard(cache.published / hex_)  # a torn leftover without marker
    attempt.rename(cache.published / hex_)
    layout.fsync_dir(cache.published)


def _seal(tree: Path) -> None:
    """Files 0444 and fsynced, directories 0555 deepest first and fsynced."""
    for dirpath, _, filenames in os.walk(tree, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, 0o444)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        layout.fsync_dir(Path(dirpath))
        os.chmod(dirpath, 0o555)

"""Materialization: turn a manifest digest into a published, verified, read-only tree, once.

One job per digest at a time; every volume asking for that digest while it runs *joins* it
(its source is added unless one with the same repository, commit and credential is listed; a
token is only ever used for its own repository).
:meth:`Materializer.ensure` never waits for bytes: it starts or joins the job and raises
:class:`Materializing` with the progress, or :class:`BackingOff` while a failure's backoff runs.
:meth:`Materializer.wait` is how a caller waits for the job to end within its own deadline
(NodePublishVolume holds kubelet's call open that way); a waiter is only an observer: leaving
(cancelled or timed out) never cancels the job, and a job with waiters is never cancelled for
being unasked. The pods that asked are kept on the job (:attr:`Job.pods`) so the bus can say who
waits for what.

An attempt: list the files at the pinned commit (the digest must match, else IntegrityMismatch),
reserve capacity, download all files (:mod:`agent.models.downloading`), then publish
(:mod:`agent.models.publishing`: every file sealed and durable, the marker, and one atomic rename,
so a reader sees either no tree or a complete one). A failure is recorded with a backoff (1 min
doubling to 1 h, in the ledger, so it survives restarts) for the source and credential that got it,
or for every request when the node itself failed (:mod:`agent.models.backoff`); ``Canceled`` does
not back off. A listing that is invalid or another digest is permanent for the pinned commit: it is
answered FAILED_PRECONDITION, not "retry later".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.to_thread
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from agent.models import backoff, diskio, downloading, layout, publishing
from agent.models.backoff import Failure
from agent.models.errors import BackingOff, Materializing, NoSpace
from agent.models.jobs import Job, JobMetrics, Pod, Reserve, Source, fraction
from agent.models.tuning import Tuning
from hub import client as hub_client
from hub import kinds, resolving
from hub.errors import (
    AccessDenied,
    HubError,
    IntegrityMismatch,
    InvalidManifest,
    SourceUnavailable,
)
from hub.manifest import Manifest

if TYPE_CHECKING:  # the pull one-shot never loads the peer client (NaCl, JSON)
    from agent.models.peerclient import PeerPull

# The records moved to :mod:`.jobs`; they stay importable from here, where callers met them.
__all__ = ["Job", "JobMetrics", "Materializer", "Pod", "Reserve", "Source", "fraction"]

log = logging.getLogger(__name__)


class Materializer:
    """Owns the jobs; :meth:`run` is the task group they live in.

    The room a job needs is reserved through the ``reserve`` given to :meth:`run`, not to the
    constructor: the collector that reserves must see the jobs, so it is built after this.
    """

    def __init__(  # noqa: PLR0913 - keyword-only: the sources (hub, ModelScope, peers) and hooks
        self,
        cache: layout.Cache,
        hub: hub_client.HubClient,
        limits: downloading.Limits,
        *,
        tuning: Tuning,
        metrics: JobMetrics,
        changed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        peers: PeerPull | None = None,
        modelscope: hub_client.HubClient | None = None,
    ) -> None:
        self.cache = cache
        self.hub = hub
        self.peers = peers
        """Peer model agents tried before the Hub (None: peer delivery is off)."""
        self.modelscope = modelscope
        """The ModelScope client (None: ModelScope sources fail as SourceUnavailable)."""
        self.limits = limits
        self.tuning = tuning
        self.metrics = metrics
        self.changed = changed
        self._clock = clock
        self.jobs: dict[str, Job] = {}
        self._unsaved: dict[str, layout.DigestRecord] = {}
        """Outcomes the ledger refused (a broken disk): still answered, never forgotten."""
        self._host: tuple[TaskGroup, Reserve] | None = None
        """Where jobs run and how they reserve room: set while :meth:`run` runs."""

    async def run(
        self, reserve: Reserve, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Host the jobs until cancelled; cancels attempts nobody asked about for too long."""
        async with anyio.create_task_group() as tg:
            self._host = (tg, reserve)
            task_status.started()
            try:
                while True:
                    await anyio.sleep(min(30.0, self.tuning.waiter_window_s / 4))
                    now = self._clock()
                    for job in list(self.jobs.values()):
                        if not job.waiters and now - job.asked > self.tuning.waiter_window_s:
                            log.info("sha256:%s: nobody waits for it, cancelling", job.hex[:12])
                            job.scope.cancel()
            finally:
                self._host = None
                tg.cancel_scope.cancel()

    def remaining(self, hex_: str) -> int:
        """Bytes the running jobs other than ``hex_`` still have to write (for reservations)."""
        return sum(j.size - j.done for h, j in self.jobs.items() if h != hex_)

    def ensure(
        self, hex_: str, source: Source, *, forced: bool = False, pod: Pod | None = None
    ) -> None:
        """Start or join the job for ``hex_``; always raises while the tree is not published.

        ``forced``: start even while backing off (a person asked, by ``model-manager pull``); the
        outcome is recorded the same way. ``pod``: who asks (kept on the job while it asks).

        :raises Materializing: running (the message has the progress).
        :raises BackingOff: the last attempt failed and the next is not due.
        """
        stamp = self._clock()
        job = self.jobs.get(hex_)
        if job is not None:
            job.join(source, stamp, pod)
            raise Materializing(job.progress())
        record = self._unsaved.get(hex_)
        if record is None:
            record = self.cache.load_digest(hex_)
        held = backoff.blocking(record, source.key, stamp)
        if held is not None and not forced:
            raise backoff.refusal(hex_, held)
        if self._host is None:
            raise BackingOff.of("the materializer is not running", reason="SourceUnavailable")
        job = Job(hex_, [source], started=stamp, asked=stamp)
        if pod is not None:
            job.pods[pod.key] = (pod, stamp)
        self.jobs[hex_] = job
        tg, reserve = self._host
        tg.start_soon(self._run_job, job, reserve, name=f"materialize-{hex_[:12]}")
        self.changed()
        raise Materializing(job.progress())

    async def _run_job(self, job: Job, reserve: Reserve) -> None:
        """Run one attempt, record its outcome, then end the job; never raises.

        The jobs live in the plugin's task group: an error escaping here would stop the whole
        plugin, so anything unexpected is logged and becomes a failed attempt. The outcome is
        recorded *before* the job leaves :attr:`jobs`, so no publish can slip in between and
        start another attempt without seeing this one's backoff.
        """
        failure: tuple[str, Failure] | None = (
            backoff.ANY,
            Failure("Canceled", "nobody asked for it any more"),
        )
        try:
            with job.scope:
                await self._attempt(job, reserve)
                failure = None
        except (backoff.Permanent, HubError, NoSpace, OSError) as e:
            failure = backoff.failure_of(job.trying.key if job.trying else backoff.ANY, e)
        except Exception as e:
            log.exception("sha256:%s: the attempt failed unexpectedly", job.hex[:12])
            failure = (
                backoff.ANY,
                Failure("SourceUnavailable", f"internal error ({type(e).__name__})"),
            )
        finally:
            # Published: nobody needs to wait, whatever was refused on the way.
            failures = {} if failure is None else {**job.denied, failure[0]: failure[1]}
            with anyio.CancelScope(shield=True):
                await self._settle(job.hex, failures)
            self.jobs.pop(job.hex, None)
            job.ended.set()
            self.changed()

    async def wait(self, hex_: str, *, until: float) -> bool:
        """Wait for the running job of ``hex_`` to end, until ``until`` (:func:`anyio.current_time`).

        True: it ended (or none was running): ask :meth:`ensure` again for the outcome. False:
        ``until`` came first. Leaving, by either way or by cancellation, only stops watching:
        the job goes on, and counts as asked for at that moment.
        """
        job = self.jobs.get(hex_)
        if job is None:
            return True
        job.waiters += 1
        try:
            with anyio.CancelScope(deadline=until):
                await job.ended.wait()
            return job.ended.is_set()
        finally:
            job.waiters -= 1
            job.asked = max(job.asked, self._clock())

    def waiting(self, hex_: str) -> list[Pod]:
        """The Pods that asked for ``hex_`` within ``waiter_window_s`` (none: no job runs)."""
        job = self.jobs.get(hex_)
        return [] if job is None else job.waiting(self._clock(), self.tuning.waiter_window_s)

    def progress(self, hex_: str) -> str | None:
        """The running job's progress message; None when none runs."""
        job = self.jobs.get(hex_)
        return None if job is None else job.progress()

    async def _settle(self, hex_: str, failures: dict[str, Failure]) -> None:
        """Record an attempt's outcome: what failed by source key (nothing: it published).

        A ledger that cannot be written keeps the outcome in memory, so it is still answered.
        """
        for failure in failures.values():
            log.warning("sha256:%s: %s: %s", hex_[:12], failure.reason, failure.message)
        last = next(reversed(failures.values())).reason if failures else "published"
        self.metrics.materializations.labels(result=last).inc()

        def change(record: layout.DigestRecord) -> layout.DigestRecord:
            return self._outcome(record, failures)

        try:
            await anyio.to_thread.run_sync(self.cache.update_digest, hex_, change)
        except Exception:
            log.exception("sha256:%s: cannot record the attempt in the ledger", hex_[:12])
            self._unsaved[hex_] = change(self._unsaved.get(hex_, layout.DigestRecord()))
        else:
            self._unsaved.pop(hex_, None)

    def _outcome(
        self, record: layout.DigestRecord, failures: dict[str, Failure]
    ) -> layout.DigestRecord:
        """``record`` after an attempt: source key -> how it failed (empty: published)."""
        if not failures:
            return backoff.succeeded(record, self._clock())
        return backoff.failed(
            record,
            failures,
            now=self._clock(),
            first_s=self.tuning.backoff_first_s,
            max_s=self.tuning.backoff_max_s,
        )

    async def _attempt(self, job: Job, reserve: Reserve) -> None:
        record = await anyio.to_thread.run_sync(
            self.cache.update_digest,
            job.hex,
            lambda r: msgspec.structs.replace(r, last_attempt=r.last_attempt + 1),
        )
        number = record.last_attempt
        attempt = await anyio.to_thread.run_sync(self.cache.new_attempt, job.hex, number)
        manifest = await self._from_peers(job, attempt, reserve)
        if manifest is None:
            manifest = await self._from_sources(job, attempt, reserve)
        job.phase = "publishing"
        await publishing.seal_files(attempt / "tree")
        await anyio.to_thread.run_sync(
            publishing.publish, self.cache, job.hex, number, attempt, manifest, job.source
        )
        self.metrics.publish_duration.observe(self._clock() - job.started)

    async def _from_sources(self, job: Job, attempt: Path, reserve: Reserve) -> Manifest:
        """Every file from the volumes' Hub sources, in order: a refusal moves to the next.

        After peers gave bytes, a file that fails its hash costs one more try of the same
        source: a lying peer's bytes of a file it did not finish are only found out at that
        file's end (the mismatch deleted them, so the retry fetches them from the Hub).
        """
        tried = 0
        while tried < len(job.sources):  # sources that join meanwhile are tried too
            job.trying = source = job.sources[tried]
            if not source.commit:
                tried += 1
                if tried >= len(job.sources):
                    raise SourceUnavailable(
                        f"sha256:{job.hex[:12]}: no peer holds it and the artifact pins no "
                        "commit to fetch it from the Hub (digestSource: Expected)"
                    )
                continue
            try:
                try:
                    return await self._download(job, source, attempt, reserve)
                except IntegrityMismatch:
                    if not job.peer_bytes:
                        raise
                    log.warning("sha256:%s: a peer's bytes failed; fetching again", job.hex[:12])
                    return await self._download(job, source, attempt, reserve)
            except AccessDenied as e:
                tried += 1
                if tried >= len(job.sources):
                    raise
                job.denied[source.key] = Failure(e.reason, str(e))
        raise SourceUnavailable(f"sha256:{job.hex[:12]}: no source")  # pragma: no cover

    async def _from_peers(self, job: Job, attempt: Path, reserve: Reserve) -> Manifest | None:
        """Every file from peer model agents that hold the digest, one peer at a time; None
        when none could give them all (the Hub sources follow, keeping what was verified).

        The peer's manifest must hash to the digest before any file is asked for, and every
        file is verified as the Hub's are: a peer that lies or fails costs only the next try.
        """
        if self.peers is None:
            return None
        tuning = msgspec.structs.replace(self.tuning, retries=1)
        for offer in self.peers.holders(job.hex):
            job.phase = f"listing the files on peer {offer.node}"
            try:
                manifest = await self.peers.manifest(offer, job.hex)
                origin = downloading.Origin(self.peers.files(offer, job.hex), "", "", None)
                await self._fetch_all(job, manifest, origin, attempt, reserve, tuning, "peer")
            except HubError as e:
                log.warning(
                    "sha256:%s: peer %s failed (%s: %s); trying the next source",
                    job.hex[:12], offer.node, e.reason, e,
                )  # fmt: skip
                continue
            return manifest
        return None

    def client(self, source: Source) -> hub_client.HubClient:
        """The client of ``source``'s hub. :raises SourceUnavailable: no ModelScope client."""
        if source.hub == kinds.HUGGING_FACE:
            return self.hub
        if self.modelscope is None:
            raise SourceUnavailable("this node has no ModelScope client")
        return self.modelscope

    async def _list(self, job: Job, source: Source) -> Manifest:
        """The manifest of ``source``'s pinned commit, which must be ``job``'s digest.

        :raises Permanent: the listing is invalid or another digest; a commit's files never
            change, so neither will that.
        """
        job.phase = "listing the files"
        try:
            manifest = source.listed or await resolving.listing(
                self.client(source),
                source.repository,
                source.commit,
                token=source.token,
                allow=source.allow,
                ignore=source.ignore,
            )
        except (InvalidManifest, IntegrityMismatch) as e:
            raise backoff.Permanent(e) from e
        if manifest.digest != "sha256:" + job.hex:
            raise backoff.Permanent(
                IntegrityMismatch(
                    f"{source.repository}@{source.commit[:12]} lists {manifest.digest}, "
                    f"not sha256:{job.hex}"
                )
            )
        return manifest

    async def _download(
        self, job: Job, source: Source, attempt: Path, reserve: Reserve
    ) -> Manifest:
        """Fetch every file of ``source``'s listing into ``attempt``."""
        manifest = await self._list(job, source)
        origin = downloading.Origin(
            self.client(source), source.repository, source.commit, source.token
        )
        await self._fetch_all(job, manifest, origin, attempt, reserve, self.tuning, "hub")
        return manifest

    async def _fetch_all(
        self,
        job: Job,
        manifest: Manifest,
        origin: downloading.Origin,
        attempt: Path,
        reserve: Reserve,
        tuning: Tuning,
        via: Literal["hub", "peer"],
    ) -> None:
        """Fetch every file of ``manifest`` from ``origin`` into ``attempt`` (what is there
        and verified stays)."""
        on_disk = await anyio.to_thread.run_sync(self.cache.partial_bytes, job.hex)
        if job.size != manifest.size:
            job.size, job.done = manifest.size, 0
        await reserve(job.hex, max(0, manifest.size - on_disk))
        job.phase = "downloading"
        present = set(await anyio.to_thread.run_sync(diskio.files_under, attempt / "tree"))
        counter = self.metrics.download_bytes.labels(source=via)

        def moved(n: int) -> None:
            job.done = min(job.size, job.done + n)
            if via == "peer":
                job.peer_bytes += n
            else:
                job.hub_bytes += n
            counter.inc(n)

        tree = attempt / "tree"
        state = attempt / "state"
        pending = iter(manifest.entries)

        async def fetcher() -> None:
            # Each takes the next file when its last one is done: ``files_per_attempt`` files
            # in flight, in manifest order, without a task and a limiter pass per file.
            for entry in pending:
                dest = tree / entry.path
                await downloading.fetch(
                    origin,
                    entry,
                    dest,
                    state / layout.state_name(entry.path),
                    limits=self.limits,
                    tuning=tuning,
                    progress=moved,
                    present=str(dest) in present,
                )

        with downloading.first_error():
            async with anyio.create_task_group() as tg:
                for _ in range(min(tuning.files_per_attempt, len(manifest.entries))):
                    tg.start_soon(fetcher)

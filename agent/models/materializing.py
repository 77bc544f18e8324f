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

An attempt (:mod:`agent.models.attempting`) lists the files at the pinned commit, reserves room,
downloads them and publishes the tree whole; here its outcome is recorded. A failure is recorded
with a backoff (1 min doubling to 1 h, in the ledger, so it survives restarts) for the source and
credential that got it, or for every request when the node itself failed
(:mod:`agent.models.backoff`); ``Canceled`` does not back off. A listing that is invalid or
another digest is permanent for the pinned commit: it is answered FAILED_PRECONDITION, not "retry
later".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus

from agent.models import backoff, downloading, layout
from agent.models.attempting import Attempts
from agent.models.backoff import Failure
from agent.models.errors import BackingOff, Materializing, NoSpace
from agent.models.jobs import Job, JobMetrics, Pod, Reserve, Source, fraction
from agent.models.tuning import Tuning
from hub import client as hub_client
from hub.errors import HubError

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
        self.tuning = tuning
        self.metrics = metrics
        self.changed = changed
        self._clock = clock
        self.attempts = Attempts(
            cache, hub, limits, tuning, metrics, clock, peers=peers, modelscope=modelscope
        )
        """Each job's attempt: its download, verification and publication steps."""
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
                await self.attempts.run(job, reserve)
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

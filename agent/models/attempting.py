"""One attempt at a digest: list the files, reserve room, download them, publish the tree.

:class:`Attempts` holds what every attempt needs (the cache, the hub clients, the peers, the
limits and tuning, the byte and publish metrics); :meth:`Attempts.run` makes one attempt for a
:class:`~agent.models.jobs.Job` and raises what failed. It records no outcome and keeps no job
table: :class:`agent.models.materializing.Materializer` owns both, and turns a failure into a
backoff.

Invariants: no file is asked of a peer before the peer's manifest hashes to the digest, and a
Hub source's listing must be the digest too, else the attempt fails as permanent for that commit
(:class:`~agent.models.backoff.Permanent`: a commit's files never change); every file is verified
as it arrives (:mod:`.downloading`) and what is on disk and verified stays for the next try; the
tree is published only whole (:mod:`.publishing`: every file sealed and durable, then one
atomic rename, so a reader sees no tree or a complete one). While an attempt runs it alone writes its
job's phase, sizes, byte counts, ``trying`` and ``denied``.

Its messages go to the materializer's logger (``agent.models.materializing``): one stream for
whoever reads a materialization's log, and one place where ``mm pull`` quiets the warnings its
own error line restates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.to_thread
import msgspec

from agent.models import backoff, diskio, downloading, layout, publishing
from agent.models.backoff import Failure
from agent.models.jobs import Job, JobMetrics, Reserve, Source
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

__all__ = ["Attempts"]

log = logging.getLogger("agent.models.materializing")


@dataclass(frozen=True)
class Attempts:
    """What every attempt needs; :meth:`run` makes one."""

    cache: layout.Cache
    hub: hub_client.HubClient
    limits: downloading.Limits
    tuning: Tuning
    metrics: JobMetrics
    clock: Callable[[], float]
    peers: PeerPull | None
    """Peer model agents tried before the Hub (None: peer delivery is off)."""
    modelscope: hub_client.HubClient | None
    """The ModelScope client (None: ModelScope sources fail as SourceUnavailable)."""

    async def run(self, job: Job, reserve: Reserve) -> None:
        """Make one attempt at ``job``'s digest, ending with its tree published; raises what
        failed (the caller records it).

        The attempt's number is counted in the ledger (it survives restarts) and the latest
        earlier attempt's directory is taken over, so what it verified is kept; peers are tried
        first, then the volumes' sources.
        """
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
        self.metrics.publish_duration.observe(self.clock() - job.started)

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
            job.received(n, via)
            counter.inc(n)

        await self._fetch_files(manifest, origin, attempt, tuning, moved, present)

    async def _fetch_files(
        self,
        manifest: Manifest,
        origin: downloading.Origin,
        attempt: Path,
        tuning: Tuning,
        moved: Callable[[int], None],
        present: set[str],
    ) -> None:
        """Fetch ``manifest``'s files, ``files_per_attempt`` at a time; ``present``: the paths
        already under the attempt's tree, ``moved``: told each chunk of bytes that arrived."""
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

"""``gpustack-operator model-manager pull REPOSITORY``: materialize a snapshot into a node cache.

How a person pre-warms a node, seeds an air-gapped cache or runs an init job. It is the CSI
path's own machinery, not a copy of it: the same resolution (:func:`hub.resolving.resolve`),
manifest and digest, the same :class:`~agent.models.materializing.Materializer` (attempt
directories, resume, verification of every byte, fsync, publication by rename) and the same
ledger records, so a later NodePublishVolume of the digest finds ``published/<hex>`` and mounts
it without a request to the Hub.

Differences, each deliberate: a pull starts even while the digest is backing off (a person
asked now; the outcome is recorded as any attempt's), it never gives up for want of a waiter,
and it reserves room by checking the filesystem's free space only — it never collects
(deletes) a tree, since it cannot see what the node's plugin has mounted.

Standard output: ``commit``, ``digest`` and ``path`` (the published tree) as YAML. Standard
error: a progress line, only on a terminal; on failure one line and exit 1. One-shot: no bus,
no HTTPS, no metrics server (nothing here imports them).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
from pathlib import Path
from typing import Literal, TextIO, cast

import anyio
import anyio.to_thread
import msgspec

from agent.models import downloading, jobs, layout, materializing
from agent.models.errors import CacheCorrupt, CacheUnusable, Materializing, NoSpace
from agent.models.manifest_cli import snapshot_of
from agent.models.tuning import Tuning
from hub import client as hub_client
from hub import endpoints, kinds, resolving
from hub.errors import HubError
from hub.manifest import Manifest
from kit.options import Flags, Options, SettingsError

__all__ = ["PullSettings", "pull_command", "settings_from"]

log = logging.getLogger(__name__)
EXIT_FAILED = 1
EXIT_USAGE = 2
CONCURRENCY = 8
"""HTTP requests in flight, as the plugin's default ``download.concurrency``."""


class PullSettings(msgspec.Struct, frozen=True, kw_only=True):
    repository: str
    revision: str
    cache_root: Path
    endpoint: str
    token: str | None = None
    allow: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    hub_env: endpoints.HubEnvironment = endpoints.HubEnvironment()
    hub_kind: kinds.Kind = kinds.HUGGING_FACE
    tuning: Tuning = Tuning(waiter_window_s=float("inf"))
    output: Literal["text", "json", "yaml"] = "text"

    @property
    def hub(self) -> hub_client.HubSettings:
        return hub_client.HubSettings.of(self.endpoint, self.hub_env)


class CacheFlags(Flags, frozen=True, kw_only=True):
    cache_root: str


def settings_from(options: Options) -> PullSettings:
    """:raises SettingsError: no single repository id, a relative cache root, a bad endpoint."""
    if len(options.positionals) != 1:
        raise SettingsError("needs exactly one REPOSITORY (owner/name)")
    root = options.read_flags(CacheFlags).cache_root
    if not root.startswith("/"):
        raise SettingsError(f"--cache-root must be an absolute path, not {root!r}")
    flags, snapshot = snapshot_of(options)
    return PullSettings(
        repository=snapshot.repository,
        revision=snapshot.revision,
        cache_root=Path(root),
        endpoint=snapshot.endpoint,
        token=snapshot.env.token,
        allow=flags.allow_pattern,
        ignore=flags.ignore_pattern,
        hub_env=snapshot.env,
        hub_kind=snapshot.kind,
        output=cast(Literal["text", "json", "yaml"], flags.output),
    )


class PullFailed(Exception):
    """The pull ended without a published tree; the message is the one line to print."""


class _Uncounted:
    """A metric that counts nothing: the one-shot serves no metrics."""

    def labels(self, *, result: str = "", source: str = "") -> _Uncounted:
        return self

    def inc(self, amount: float = 1) -> None:
        return None

    def observe(self, amount: float) -> None:
        return None


class _NoMetrics:
    download_bytes = materializations = publish_duration = _Uncounted()


def pull_command(settings: PullSettings) -> int:
    pulled: list[tuple[Manifest, Path]] = []

    async def main() -> None:
        # The loop's main task returns nothing: asyncio's runner reprs that task, result
        # included, when it restores the SIGINT handler, and a manifest's repr grows with its
        # files (0.5 ms for 200 of them, on a process that is done).
        pulled.append(await pull(settings, sys.stderr))

    try:
        anyio.run(main, backend_options=_loop_options())
    except CacheUnusable as e:
        log.error("--cache-root: %s", e)
        return EXIT_USAGE
    except (PullFailed, HubError, CacheCorrupt, OSError) as e:
        reason = getattr(e, "reason", None)
        log.error("%s%s", f"{reason}: " if reason else "", e)
        return EXIT_FAILED
    [(manifest, tree)] = pulled
    from agent.models import manifest_cli

    sys.stdout.write(
        manifest_cli.pulled_document(
            manifest,
            tree,
            settings.output,
            repository=settings.repository,
            revision=settings.revision,
        )
    )
    return 0


def _loop_options() -> dict[str, object]:
    """uvloop where it is installed, as the services run (its transports cost less per request
    and per byte than asyncio's)."""
    return {"use_uvloop": importlib.util.find_spec("uvloop") is not None}


async def pull(settings: PullSettings, tty: TextIO | None = None) -> tuple[Manifest, Path]:
    """Resolve, then materialize unless published; returns the manifest and the tree's path.

    ``tty``: where a progress line goes, if it is a terminal. :raises PullFailed: the attempt
    failed (its reason and message, as the ledger recorded them).
    """
    cache = await anyio.to_thread.run_sync(layout.Cache.open, settings.cache_root)
    async with hub_client.client(settings.hub, kind=kinds.client_class(settings.hub_kind)) as hub:
        manifest = await resolving.resolve(
            settings.repository,
            settings.revision,
            token=settings.token,
            allow=settings.allow,
            ignore=settings.ignore,
            hub=hub,
        )
        hex_ = manifest.digest.removeprefix("sha256:")
        if not await anyio.to_thread.run_sync(cache.is_published, hex_):
            source = jobs.Source(
                settings.repository, manifest.commit or "", settings.token,
                settings.allow, settings.ignore, listed=manifest,
            )  # fmt: skip
            await _materialize(cache, hub, hex_, source, settings.tuning, tty)
    return manifest, cache.tree(hex_)


async def _materialize(
    cache: layout.Cache,
    hub: hub_client.HubClient,
    hex_: str,
    source: jobs.Source,
    tuning: Tuning,
    tty: TextIO | None,
) -> None:
    ended = anyio.Event()
    quiet = _Restated()
    materializing.log.addFilter(quiet)  # the failure is this command's one line instead
    try:
        await _attempt(cache, hub, hex_, source, tuning, tty, ended)
    finally:
        materializing.log.removeFilter(quiet)
    if not await anyio.to_thread.run_sync(cache.is_published, hex_):
        record = cache.load_digest(hex_)
        raise PullFailed(f"{record.reason or 'Failed'}: {record.message or 'no tree published'}")


class _Restated(logging.Filter):
    """Drops the materializer's warning about a failed attempt: the pull's error restates it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno != logging.WARNING


async def _attempt(
    cache: layout.Cache,
    hub: hub_client.HubClient,
    hex_: str,
    source: jobs.Source,
    tuning: Tuning,
    tty: TextIO | None,
    ended: anyio.Event,
) -> None:
    m = materializing.Materializer(
        cache,
        hub,
        downloading.Limits(CONCURRENCY, 0),
        tuning=tuning,
        metrics=_NoMetrics(),
        changed=lambda: None if hex_ in m.jobs else ended.set(),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(m.run, _reserve_free_space(cache))
        try:
            m.ensure(hex_, source, forced=True)
        except Materializing:
            pass
        if tty is not None and tty.isatty():
            tg.start_soon(_progress, m, hex_, tty)
        await ended.wait()
        tg.cancel_scope.cancel()


def _reserve_free_space(cache: layout.Cache) -> jobs.Reserve:
    async def reserve(_: str, needed: int) -> None:
        st = await anyio.to_thread.run_sync(os.statvfs, cache.root)
        free = st.f_bavail * st.f_frsize
        if needed > free:
            raise NoSpace(f"needs {needed} more bytes but the cache filesystem has {free} free")

    return reserve


async def _progress(m: materializing.Materializer, hex_: str, out: TextIO) -> None:
    """Redraw one progress line on the terminal until cancelled (then end the line)."""
    begun = time.monotonic()
    try:
        while True:
            job = m.jobs.get(hex_)
            if job is not None:
                out.write("\r\x1b[K" + _line(job, time.monotonic() - begun))
                out.flush()
            await anyio.sleep(0.2)
    finally:
        out.write("\r\x1b[K")
        out.flush()


def _line(job: jobs.Job, elapsed: float) -> str:
    if job.phase != "downloading" or not job.size:
        return f"sha256:{job.hex[:12]}: {job.phase}"
    share = job.done / job.size
    bar = "#" * int(share * 30)
    rate = job.done / max(elapsed, 1e-3)
    return (
        f"sha256:{job.hex[:12]} [{bar:<30}] {share:4.0%} {jobs.human(job.done)} of "
        f"{jobs.human(job.size)} {jobs.human(rate)}/s"
    )

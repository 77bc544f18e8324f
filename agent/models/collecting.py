"""Watermark-driven collection of unreferenced models, and capacity reservations.

:func:`plan` is the pure decision: when the filesystem is fuller than the high watermark,
remove the least recently used *eligible* trees until usage would fall to the low watermark.
Eligible: published, not referenced by a mount, not pinned, not being downloaded, unused for at
least ``idle_s``; or a partial with no running attempt. :class:`Collector` does the I/O: the
removal itself happens under the claim lock, so a publish can never claim a tree that is
being removed (and the collector never removes a tree a publish has claimed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import anyio
import anyio.to_thread

from agent.models import layout
from agent.models.errors import NoSpace
from agent.models.metrics import ModelMetrics
from bus.records import StoreSpec

__all__ = ["Candidate", "Collector", "plan"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    hex: str
    size: int
    last_used: float
    partial: bool = False


def plan(
    candidates: Collection[Candidate],
    *,
    used: int,
    total: int,
    spec: StoreSpec,
    busy: Collection[str],
    now: float,
    idle_s: float,
    needed: int = 0,
) -> list[Candidate]:
    """What to remove, oldest first, so that ``used + needed`` ends at or below the low mark.

    Nothing when ``used + needed`` is within the high watermark. ``busy``: referenced, pinned
    or downloading digests, never removed.
    """
    if total <= 0 or (used + needed) * 100 <= spec.watermarks.high_percent * total:
        return []
    goal = spec.watermarks.low_percent * total // 100
    eligible = sorted(
        (c for c in candidates if c.hex not in busy and (c.partial or now - c.last_used >= idle_s)),
        key=lambda c: (c.last_used, c.hex),
    )
    chosen: list[Candidate] = []
    for c in eligible:
        if used + needed <= goal:
            break
        chosen.append(c)
        used -= c.size
    return chosen


class Collector:
    def __init__(
        self,
        cache: layout.Cache,
        *,
        claim: anyio.Lock,
        busy: Callable[[], set[str]],
        remaining: Callable[[str], int],
        spec: Callable[[], StoreSpec | None],
        metrics: ModelMetrics,
        idle_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.cache = cache
        self.claim = claim
        self._busy = busy
        self._remaining = remaining
        self._spec = spec
        self.metrics = metrics
        self.idle_s = idle_s
        self._clock = clock

    def _candidates(self) -> list[Candidate]:
        found = []
        for hex_ in self.cache.published_hexes():
            record = self.cache.load_digest(hex_)
            found.append(Candidate(hex_, self.cache.size_of(hex_), record.last_used))
        for hex_ in self.cache.partial_hexes():
            if not self.cache.is_published(hex_):
                record = self.cache.load_digest(hex_)
                found.append(
                    Candidate(hex_, self.cache.partial_bytes(hex_), record.last_used, True)
                )
        return found

    async def collect(self, needed: int = 0) -> int:
        """Remove what :func:`plan` says; returns the bytes freed. Skipped without a valid spec."""
        spec = self._spec()
        if spec is None or spec.problems():
            log.info("collection skipped: no valid NodeModelStore spec")
            return 0
        freed = 0
        async with self.claim:
            used, total = await anyio.to_thread.run_sync(self.cache.usage)
            candidates = await anyio.to_thread.run_sync(self._candidates)
            busy = self._busy() | {p.removeprefix("sha256:") for p in spec.pinned}
            for c in plan(
                candidates,
                used=used,
                total=total,
                spec=spec,
                busy=busy,
                now=self._clock(),
                idle_s=self.idle_s,
                needed=needed,
            ):
                log.info("collecting sha256:%s (%d bytes)", c.hex[:12], c.size)
                await anyio.to_thread.run_sync(self.cache.remove, c.hex)
                freed += c.size
        self.metrics.gc_removed_bytes.inc(freed)
        return freed

    async def reserve(self, hex_: str, remaining: int) -> None:
        """Make room for ``remaining`` more bytes of ``hex_`` under the high watermark.

        :raises NoSpace: even after collection it does not fit.
        """
        spec = self._spec() or StoreSpec()
        needed = remaining + self._remaining(hex_)
        used, total = await anyio.to_thread.run_sync(self.cache.usage)
        limit = spec.watermarks.high_percent * total // 100
        if used + needed <= limit:
            return
        await self.collect(needed)
        used, total = await anyio.to_thread.run_sync(self.cache.usage)
        if used + needed > limit:
            raise NoSpace(
                f"needs {needed} bytes but only {max(0, limit - used)} are free below the "
                f"{spec.watermarks.high_percent}% high watermark"
            )

    async def run(self, every_s: float) -> None:
        """Collect periodically until cancelled."""
        while True:
            await anyio.sleep(every_s)
            try:
                await self.collect()
            except OSError as e:
                log.warning("collection failed: %s", e)

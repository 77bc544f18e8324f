"""The node's model cache as bus events, metrics and ``/model/downloads``.

:func:`snapshot` is pure: cache facts in, one :class:`bus.events.ModelsEvent` out (the whole
cache, so the last event alone is the node's state). :class:`Reporter` publishes it when the
state changes (a model appears, finishes, fails, is collected) at once, and progress only when
``report_every_s`` passed *and* some download moved ``report_step`` of its size, so a large
download produces a bounded number of messages; an unchanged state again every ``resync_s``
(the bus expires retained state nobody republishes), and at once after a reconnect
(:meth:`Reporter.republish`: the server may have lost it). Models are named by digest only: the bus
never learns an artifact or repository from this plugin. A download names the Pods waiting for
it (namespace, name, uid, as allocation events name theirs), so the worker, which may write to
the API, can post their progress as Pod events; a Pod starting to wait is a change reported at
once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import anyio
import anyio.to_thread
import msgspec

from agent.models import layout
from agent.models.jobs import Job, Pod
from agent.models.materializing import Materializer
from agent.models.metrics import ModelMetrics
from agent.models.settings import Tuning
from bus import events

__all__ = ["Changes", "Facts", "Reporter", "Sink", "downloads_json", "snapshot"]

log = logging.getLogger(__name__)


class Sink(Protocol):
    """Where events go: :class:`bus.publishing.Publisher` in production, a list in tests."""

    def publish(self, event: events.Event) -> None: ...


@dataclass(frozen=True)
class Facts:
    published: Mapping[str, int]
    """hex -> size of every published tree."""
    failures: Mapping[str, layout.DigestRecord]
    """hex -> record, for digests whose last attempt failed."""
    jobs: Mapping[str, tuple[int, int]]
    """hex -> (done, size) of running downloads."""
    waiting: Mapping[str, tuple[Pod, ...]] = field(default_factory=dict)
    """hex -> the Pods waiting for its running download."""
    references: Mapping[str, int] = field(default_factory=dict)
    """hex -> number of mounts using it."""
    last_used: Mapping[str, float] = field(default_factory=dict)
    """hex -> unix time of the last mount or unmount (absent or 0: never)."""
    used_bytes: int | None = None
    capacity_bytes: int | None = None
    """``statvfs`` of the cache root: (used, total) bytes of its filesystem."""
    sources: Mapping[str, Literal["Hub", "Peer"]] = field(default_factory=dict)
    """hex -> where most bytes of a published tree or a running download came from."""


def _time(unix: float | None) -> datetime | None:
    return datetime.fromtimestamp(unix, UTC) if unix else None


def _state(hex_: str, facts: Facts, **fields: Any) -> events.ModelState:
    """One model with what every state carries: its digest, references and last use."""
    digest = "sha256:" + hex_
    return events.ModelState(
        model=digest,
        digest=digest,
        referenced=facts.references.get(hex_, 0),
        last_used=_time(facts.last_used.get(hex_)),
        **fields,
    )


def snapshot(node: str, facts: Facts) -> events.ModelsEvent:
    """The whole cache as one event: ready, then downloading, then failed models, by digest.

    A digest is reported once, in its most advanced state (published beats downloading beats
    failed). ``message`` of a failed model stays ``"<reason>: <detail>"`` as before ``reason``
    existed, so older readers keep their meaning.
    """
    models: list[events.ModelState] = []
    for hex_, size in sorted(facts.published.items()):
        models.append(
            _state(hex_, facts, state="ready", bytes_total=size, source=facts.sources.get(hex_))
        )
    for hex_, (done, size) in sorted(facts.jobs.items()):
        if hex_ not in facts.published:
            pods = tuple(
                events.WaitingPod(namespace=p.namespace, name=p.name, uid=p.uid or None)
                for p in facts.waiting.get(hex_, ())
            )
            models.append(
                _state(
                    hex_,
                    facts,
                    state="downloading",
                    bytes_done=done,
                    bytes_total=size,
                    waiting_pods=pods or None,
                    source=facts.sources.get(hex_),
                )
            )
    for hex_, record in sorted(facts.failures.items()):
        if hex_ not in facts.published and hex_ not in facts.jobs:
            models.append(
                _state(
                    hex_,
                    facts,
                    state="failed",
                    message=f"{record.reason}: {record.message}",
                    reason=record.reason,
                    retry_time=_time(record.retry_at),
                )
            )
    return events.ModelsEvent(
        node=node,
        models=tuple(models),
        capacity_bytes=facts.capacity_bytes,
        stored_bytes=sum(facts.published.values()),
        used_bytes=facts.used_bytes,
    )


def _shape(event: events.ModelsEvent) -> tuple[object, ...]:
    """What is published at once when it changes: everything but progress and disk usage."""
    return (
        event.capacity_bytes,
        event.stored_bytes,
        tuple(
            (
                m.model,
                m.state,
                m.referenced,
                m.last_used,
                m.reason,
                m.retry_time,
                m.waiting_pods,
                m.source,
            )
            for m in event.models
        ),
    )


def downloads_json(jobs: Mapping[str, Job]) -> bytes:
    """The body of ``GET /model/downloads``: running downloads, by digest."""
    return msgspec.json.encode(
        [
            {
                "digest": "sha256:" + j.hex,
                "downloadedBytes": j.done,
                "sizeBytes": j.size,
                "source": j.source,
            }
            for j in jobs.values()
        ]
    )


class Changes:
    """Tells the reporter that what it reports changed, so it reports at once.

    Created before both sides: whatever changes the cache's state (the materializer, the
    volumes) is built with :meth:`changed`, the :class:`Reporter` that waits is built with this.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()

    def changed(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        """Until :meth:`changed` was called (since the last wait) or ``timeout_s`` passed."""
        with anyio.move_on_after(timeout_s):
            await self._event.wait()
        self._event = anyio.Event()


class Reporter:
    def __init__(
        self,
        node: str,
        cache: layout.Cache,
        materializer: Materializer,
        sink: Sink | None,
        *,
        changes: Changes,
        references: Callable[[], Mapping[str, int]],
        metrics: ModelMetrics,
        tuning: Tuning,
    ) -> None:
        self.node = node
        self.references = references
        """hex -> mounts using it (:meth:`Volumes.reference_counts`)."""
        self.changes = changes
        self.cache = cache
        self.materializer = materializer
        self.sink = sink
        self.metrics = metrics
        self.tuning = tuning
        self._last: events.ModelsEvent | None = None
        self._last_at = 0.0
        self.last: events.ModelsEvent | None = None

    def _facts(
        self,
        references: dict[str, int],
        jobs: dict[str, tuple[int, int]],
        waiting: dict[str, tuple[Pod, ...]],
        job_sources: dict[str, Literal["Hub", "Peer"]],
    ) -> Facts:
        """Read the cache (in a thread): published trees, failures, last uses, usage.

        ``references`` and ``jobs`` are copied on the event loop, which owns those dicts.
        """
        published: dict[str, int] = {}
        sources = dict(job_sources)
        for h in self.cache.published_hexes():
            marker = self.cache.marker(h)
            published[h] = marker.size_bytes if marker is not None else self.cache.size_of(h)
            if marker is not None:
                sources[h] = marker.source
        failures = {}
        last_used = {}
        for h in self.cache.digest_hexes():
            record = self.cache.load_digest(h)
            last_used[h] = record.last_used
            if record.reason is not None:
                failures[h] = record
        used, total = self.cache.usage()
        self.metrics.stored_bytes.set(sum(published.values()))
        self.metrics.capacity_bytes.set(total)
        return Facts(
            published,
            failures,
            jobs,
            waiting=waiting,
            references=references,
            last_used=last_used,
            used_bytes=used,
            capacity_bytes=total,
            sources=sources,
        )

    def _moved_enough(self, event: events.ModelsEvent) -> bool:
        if self._last is None:
            return True
        before = {m.model: m.bytes_done or 0 for m in self._last.models}
        step = self.tuning.report_step
        return any(
            (m.bytes_done or 0) - before.get(m.model, 0) >= step * m.bytes_total
            for m in event.models
            if m.state == "downloading" and m.bytes_total
        )

    async def report_once(self) -> None:
        references = dict(self.references())
        jobs = {h: (j.done, j.size) for h, j in self.materializer.jobs.items()}
        sources = {h: j.source for h, j in self.materializer.jobs.items()}
        waiting = {h: tuple(self.materializer.waiting(h)) for h in jobs}
        facts = await anyio.to_thread.run_sync(self._facts, references, jobs, waiting, sources)
        event = snapshot(self.node, facts)
        self.last = event
        now = time.monotonic()
        since = now - self._last_at
        due = since >= self.tuning.report_every_s and self._moved_enough(event)
        resync = since >= self.tuning.resync_s  # retained state expires if never republished
        if self._last is None or _shape(event) != _shape(self._last) or due or resync:
            self._last, self._last_at = event, now
            if self.sink is not None:
                self.sink.publish(event)

    def republish(self) -> None:
        """Publish the latest report again: the bus may have lost it (a reconnect)."""
        if self.sink is not None and self.last is not None:
            self.sink.publish(self.last)

    async def run(self, *, tick_s: float = 1.0) -> None:
        """Report on every change, and check progress every ``tick_s``, until cancelled."""
        while True:
            try:
                await self.report_once()
            except OSError as e:
                log.warning("cannot read the cache for a report: %s", e)
            await self.changes.wait(tick_s)

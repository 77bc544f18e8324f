"""The device agent's observer: detection, sampling and health for the node, every period.

:class:`Observer` owns the view the agent publishes: each pass (:meth:`Observer.pass_once`)
detects and samples in a worker thread, one pass at a time, and decides on the event loop thread
through :class:`agent.serve.health.HealthBook`; XIDs from the watcher arrive through
:meth:`Observer.on_xid`. Every transition and every changed (or resync-due) device list is
published and pushed to the device plugins. :mod:`agent.serve.running` builds it and runs its loops.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
from prometheus_client import Histogram

from agent.deviceplugin.holdings import Change
from agent.deviceplugin.running import Plugins
from agent.devices import detection, nvidia
from agent.devices.libs.nvml import Nvml
from agent.serve import health, metrics
from agent.serve.settings import ServeSettings
from bus import devices, events
from kit import serving

__all__ = ["Observer", "keep_failed"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Observer:
    """Detection, sampling and health for the node; owns the published view.

    Mutated only on the event loop thread: passes run in a worker thread and hand back plain
    values; XIDs arrive through :meth:`on_xid` on the loop. Every event goes to ``publish``
    (the bus publisher's, which never blocks); the device plugins to push the view to are given
    to :meth:`observe`, the loop that feeds them (:attr:`plugins` is None until it starts).
    """

    def __init__(
        self,
        settings: ServeSettings,
        backends: Sequence[detection.Backend],
        publish: Callable[[events.Event], None],
        agent_metrics: metrics.AgentMetrics,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.publish = publish
        self.metrics = agent_metrics
        self.book = health.HealthBook(quarantine_s=settings.health_quarantine_s)
        self.plugins: Plugins | None = None
        self.detected: list[devices.DeviceGroup] = []
        self.published: list[devices.DeviceGroup] = []
        self.samples: list[devices.MonitorSample] = []
        self.last_samples: events.SamplesEvent | None = None
        self.last_xids: dict[str, int] = {}
        self.passes = 0
        self._limiter = anyio.CapacityLimiter(1)
        self._wake = anyio.Event()
        self._devices_sent_at: float | None = None
        self._started_at = events.now()

    # -- what others read -----------------------------------------------------------------------

    def is_ready(self) -> bool:
        """A pass is published and kubelet holds every plugin's registration."""
        return self.passes > 0 and self.plugins is not None and self.plugins.connected()

    async def snapshot(self) -> serving.Response:
        if self.last_samples is None:
            return serving.Response(status=503, body=b"no sample yet\n")
        body = msgspec.json.encode(self.last_samples)
        return serving.Response(body=body, content_type="application/json")

    def nvml_adapters(self) -> list[Nvml]:
        return [b.nvml for b in self.backends if isinstance(b, nvidia.NvidiaBackend)]

    def metric_sources(self, *, outbox_depth: Callable[[], int]) -> metrics.Sources:
        def nvml_errors() -> dict[str, int]:
            total: dict[str, int] = {}
            for nvml in self.nvml_adapters():
                for call, count in nvml.errors_by_call.items():
                    total[call] = total.get(call, 0) + count
            return total

        return metrics.Sources(
            node=self.settings.node_name,
            view=lambda: (self.published, self.samples),
            nvml_errors=nvml_errors,
            outbox_depth=outbox_depth,
            registrations=lambda: self.plugins.registrations if self.plugins else 0,
            holders=self.holders,
            xids=lambda: self.last_xids,
            naming=self.settings.metrics_names,
        )

    def holders(self) -> dict[str, list[metrics.Holder]]:
        """Accelerator id -> the containers holding it, as far as kubelet named them (its
        pod-resources API fills the names in; an allocation it has not reported yet has none)."""
        out: dict[str, list[metrics.Holder]] = {}
        for h in self.plugins.ledger().holdings() if self.plugins is not None else ():
            if h.pod_name is None:
                continue
            holder = (h.pod_namespace or "", h.pod_name, h.container or "")
            for card, _units in h.charges:
                if holder not in out.setdefault(card, []):
                    out[card].append(holder)
        return out

    # -- loops ----------------------------------------------------------------------------------

    async def observe(self, plugins: Plugins, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """A pass now, ready, then a pass every monitor period (sooner when woken).

        Every pass and health transition from now on is pushed to ``plugins``.
        """
        self.plugins = plugins
        await self.pass_once(first=True)
        task_status.started()
        while True:
            with anyio.move_on_after(self.settings.monitor_period_s):
                await self._wake.wait()
            self._wake = anyio.Event()
            await self.pass_once()

    def wake(self) -> None:
        """Run the next pass now (the XID watcher lost its event set)."""
        self._wake.set()

    async def heartbeat(self) -> None:
        while True:
            self.publish(self._agent_event())
            await anyio.sleep(self.settings.heartbeat_s)

    def _agent_event(self) -> events.AgentEvent:
        return events.AgentEvent(
            node=self.settings.node_name,
            version=self.settings.version,
            capabilities=tuple(sorted(b.manufacturer for b in self.backends)),
            started_at=self._started_at,
            heartbeat_s=self.settings.heartbeat_s,
        )

    def republish(self) -> None:
        """Publish the node's whole state again: the bus may have lost it (a reconnect).

        Devices (once a pass published them), every card that is down now, every allocation
        the device plugins hold, and the agent record. Repeats are harmless: the same devices,
        an allocation already known, a card already known to be down. Healthy cards need no
        event: the devices event says so.
        """
        node = self.settings.node_name
        if self.passes:
            self.publish(events.DevicesEvent(node=node, groups=tuple(self.published)))
        for accelerator_id in sorted(self.book.unhealthy_ids):
            down = self.book.down(accelerator_id)
            if down is not None:
                self.publish(down.event(node, accelerator_id))
        if self.plugins is not None:
            for holding in self.plugins.ledger().holdings():
                self.publish(Change("allocated", holding).event(node))
        self.publish(self._agent_event())

    # -- one pass ---------------------------------------------------------------------------------

    async def pass_once(self, *, first: bool = False) -> None:
        detect = functools.partial(
            detection.detect,
            self.backends,
            fast_failed=first and self.settings.detect.fast_failed,
            retries=self.settings.detect.retries,
            retry_delay_s=self.settings.detect.retry_delay_s,
        )
        found = await self._timed(detect, self.metrics.detection_seconds)
        sampled = await self._timed(
            functools.partial(detection.sample, self.backends), self.metrics.monitor_seconds
        )
        failed = {e.manufacturer for e in (*found.errors, *sampled.errors)}
        for error in (*found.errors, *sampled.errors):
            log.warning("pass failed: %s", error)
            self.metrics.pass_failures.labels(manufacturer=error.manufacturer).inc()
        self.detected = keep_failed(found.items, self.published, failed)
        now = anyio.current_time()
        expected = health.expected_ids([*self.published, *self.detected])
        self._transitions(self.book.observe(expected, sampled.items, failed, now))
        self._refresh(now)
        self.samples = health.overlay_samples(self.book, sampled.items)
        self.last_samples = events.SamplesEvent(
            node=self.settings.node_name,
            period_s=self.settings.monitor_period_s,
            samples=tuple(self.samples),
        )
        self.publish(self.last_samples)
        self.passes += 1

    async def _timed(self, call: Callable[[], T], histogram: Histogram) -> T:
        """Run one pass in the worker thread (one at a time), timing it into ``histogram``."""
        started = time.perf_counter()
        try:
            return await anyio.to_thread.run_sync(call, limiter=self._limiter)
        finally:
            histogram.observe(time.perf_counter() - started)

    def on_xid(self, accelerator_id: str, xid: int) -> None:
        """An XID from the watcher: decide, and on a transition publish and push at once."""
        now = anyio.current_time()
        self.last_xids[accelerator_id] = xid  # every XID, ignored ones too, as DCGM reports
        change = self.book.xid(accelerator_id, xid, now)
        if change is None:
            log.info("XID %d on %s: no health change", xid, accelerator_id)
            return
        self._transitions([change])
        self._refresh(now)

    def _transitions(self, changes: Sequence[health.Transition]) -> None:
        for change in changes:
            level = logging.INFO if change.healthy else logging.WARNING
            log.log(level, "%s is %s: %s", change.accelerator_id,
                    "Healthy" if change.healthy else "Unhealthy", change.message)  # fmt: skip
            self.publish(change.event(self.settings.node_name))

    def _refresh(self, now: float) -> None:
        """Recompute the published groups; push them to kubelet; publish on change or resync."""
        groups = health.overlay(self.book, self.detected, self.published)
        changed = groups != self.published
        self.published = groups
        self.samples = health.overlay_samples(self.book, self.samples)  # what /metrics shows
        if self.plugins is not None:
            self.plugins.update(groups)
        due = (
            self._devices_sent_at is None
            or now - self._devices_sent_at >= self.settings.resync_period_s
        )
        if changed or due:
            self.publish(events.DevicesEvent(node=self.settings.node_name, groups=tuple(groups)))
            self._devices_sent_at = now


def keep_failed(
    detected: Sequence[devices.DeviceGroup],
    previous: Sequence[devices.DeviceGroup],
    failed: set[str],
) -> list[devices.DeviceGroup]:
    """``detected`` plus the previous groups of manufacturers whose pass failed this time.

    A failed pass says nothing about the cards, so they are neither dropped nor changed.
    """
    if not failed:
        return list(detected)
    kept = [g for g in previous if g.manufacturer in failed]
    return devices.canonical_groups([*[g for g in detected if g.manufacturer not in failed], *kept])

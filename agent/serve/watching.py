"""Watching NVML for XID critical errors: the thin async side of :mod:`agent.serve.health`.

One task holds an NVML session and an event set with every card registered for
``nvmlEventTypeXidCriticalError`` (cards without event support are skipped, as NVIDIA's plugin
does) and waits on it in a worker thread, ``wait_s`` at a time so that cancellation is never
blocked for longer than one wait. Each XID is handed to ``on_xid(uuid, xid)`` on the event loop
at once; the decision is :class:`agent.serve.health.HealthBook`'s.

When the wait fails (a card fell off the bus answers ``GPU_IS_LOST`` here), the watcher does not
guess which card: it calls ``on_failure()`` (the agent runs a monitor pass now, which finds the
lost card by name) and re-creates the event set after ``retry_s``. NVML being absent or failing
to initialise is retried every ``retry_s`` too: a driver that loads late is picked up.

Invariant: the event set is freed and the session shut down on every exit, shielded, even when
cancelled; no worker thread outlives the task (waits are never abandoned).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from agent.devices.libs.nvml import Nvml, NvmlError, NvmlUnsupported

log = logging.getLogger(__name__)


class _Watch:
    """An open NVML session and event set; synchronous, used from one worker thread at a time."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self.event_set: Any = None
        self.registered = 0
        self.initialized = False

    def open(self) -> None:
        """Init NVML and register every card that supports XID events.

        :raises NvmlError: init, the device count or the set itself failed (all undone).
        """
        self.nvml.init()
        self.initialized = True
        try:
            self.event_set = self.nvml.event_set_create()
            for index in range(self.nvml.device_count()):
                self._register(index)
        except NvmlError:
            self.close()
            raise

    def _register(self, index: int) -> None:
        try:
            self.nvml.register_xid_events(self.nvml.handle(index), self.event_set)
            self.registered += 1
        except NvmlUnsupported:
            log.info("NVIDIA card %d has no XID event support; not watched", index)
        except NvmlError as e:
            log.warning("NVIDIA card %d: cannot watch XID events (%s)", index, e)

    def next_xid(self, timeout_ms: int) -> tuple[str, int] | None:
        """``(uuid, xid)`` of the next event, or None after ``timeout_ms`` of quiet."""
        event = self.nvml.wait_xid(self.event_set, timeout_ms)
        if event is None:
            return None
        return self.nvml.uuid(event.handle), event.xid

    def close(self) -> None:
        """Free the set and shut NVML down; a no-op when not (or no longer) open."""
        if not self.initialized:
            return
        self.initialized = False
        try:
            if self.event_set is not None:
                self.nvml.event_set_free(self.event_set)
        except NvmlError as e:
            log.debug("NVML event set free failed: %s", e)
        finally:
            self.event_set = None
            try:
                self.nvml.shutdown()
            except NvmlError as e:
                log.debug("NVML shutdown failed: %s", e)


async def watch_xids(
    nvml: Nvml,
    *,
    on_xid: Callable[[str, int], None],
    on_failure: Callable[[], None],
    wait_s: float,
    retry_s: float,
) -> None:
    """Deliver XID events until cancelled (see the module docstring)."""
    limiter = anyio.CapacityLimiter(1)  # one thread per watcher; detection has its own
    while True:
        watch = _Watch(nvml)
        try:
            # Inside the try: a cancellation arriving while open() runs still closes what it
            # opened.
            await anyio.to_thread.run_sync(watch.open, limiter=limiter)
            await _deliver(watch, on_xid, wait_s, limiter)
        except NvmlError as e:
            if watch.initialized:
                log.warning("waiting for XID events failed (%s); checking every card now", e)
                on_failure()
            else:
                log.info("not watching XID events (%s); trying again in %.0fs", e, retry_s)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(watch.close, limiter=limiter)
        await anyio.sleep(retry_s)


async def _deliver(
    watch: _Watch,
    on_xid: Callable[[str, int], None],
    wait_s: float,
    limiter: anyio.CapacityLimiter,
) -> None:
    timeout_ms = max(1, round(wait_s * 1000))
    while True:
        got = await anyio.to_thread.run_sync(watch.next_xid, timeout_ms, limiter=limiter)
        if got is not None:
            uuid, xid = got
            log.warning("NVIDIA %s reported XID %d", uuid, xid)
            on_xid(uuid, xid)

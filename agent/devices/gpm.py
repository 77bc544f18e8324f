"""Activity ratios from NVML's GPU Performance Monitoring (GPM, Hopper and later).

``nvmlDeviceGetUtilizationRates`` answers NOT_SUPPORTED on a card in MIG mode, so such a card,
and each of its GPU instances, would have no activity figure at all. GPM gives one: it reads
the card's performance counters into a sample buffer (``nvmlGpmSampleGet``, or
``nvmlGpmMigSampleGet`` for one GPU instance), and ``nvmlGpmMetricsGet`` turns *two* samples
into rates over the interval between them. These are the figures DCGM's profiling fields
report (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``DCGM_FI_PROF_SM_ACTIVE``,
``DCGM_FI_PROF_SM_OCCUPANCY``, ``DCGM_FI_PROF_DRAM_ACTIVE``, ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``),
as ratios 0-1.

:class:`GpmSampler` is the monitor's state between passes: per card (UUID) and per GPU
instance (UUID, GI id, profile) it keeps the previous sample and a spare buffer, so each pass
takes one new sample and computes the activity since the last pass. Invariants:

- the first pass over a card or instance yields nothing (one sample is not a rate);
- a sample is taken at most every ``min_interval_s`` (NVML refreshes its counters every
  100 ms); a pass sooner than that reuses the last activity;
- a failure on a key forgets its samples (the next two passes start over) and re-raises, so the
  backend's usual per-field handling applies; a card without GPM is asked once per UUID, and a
  sample refused as unsupported (a MIG-mode card may refuse its whole-card one) is not retried;
- keys not sampled in a pass are freed by :meth:`GpmSampler.prune` (a destroyed instance, a
  card that went away), and :meth:`GpmSampler.close` frees every buffer.

Samples live across NVML sessions (each monitor pass opens its own): the buffers are host
memory owned by the caller and the counters are the card's, so ``nvmlGpmMetricsGet`` (which
takes no device) only needs the two buffers. In ``dm serve`` the XID watcher also holds NVML
initialised throughout. Not yet checked on hardware.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.devices.libs.nvml import (
    GPM_ANY_TENSOR_UTIL,
    GPM_DRAM_BW_UTIL,
    GPM_GRAPHICS_UTIL,
    GPM_SM_OCCUPANCY,
    GPM_SM_UTIL,
    Handle,
    Nvml,
    NvmlError,
    NvmlUnsupported,
)

log = logging.getLogger(__name__)

METRICS = (GPM_GRAPHICS_UTIL, GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_DRAM_BW_UTIL, GPM_ANY_TENSOR_UTIL)
MIN_INTERVAL_S = 0.1
"""NVML's GPM counters refresh every 100 ms; two samples closer than that are not a rate."""

Key = tuple[str, int | None, str | None]
"""``(card UUID, GPU instance id or None for the whole card, GI profile name)``."""


@dataclass(frozen=True)
class Activity:
    """Activity over the last interval, each a ratio 0-1 (None: the card did not give it)."""

    gr_engine_active: float | None = None
    """Time the graphics/compute engine was busy (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``)."""
    sm_active: float | None = None
    """SMs busy, averaged over the interval (``DCGM_FI_PROF_SM_ACTIVE``)."""
    sm_occupancy: float | None = None
    """Resident warps against the SMs' maximum (``DCGM_FI_PROF_SM_OCCUPANCY``)."""
    dram_active: float | None = None
    """Peak DRAM bandwidth used (``DCGM_FI_PROF_DRAM_ACTIVE``)."""
    tensor_active: float | None = None
    """The tensor pipes' peak used (GPM ``ANY_TENSOR_UTIL``; ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``)."""


def activity(percents: dict[int, float]) -> Activity:
    """Percentages by GPM metric id -> ratios, clamped to 0-1 (pure)."""

    def ratio(metric: int) -> float | None:
        value = percents.get(metric)
        if value is None or math.isnan(value):
            return None
        return round(min(max(value / 100.0, 0.0), 1.0), 4)

    return Activity(
        gr_engine_active=ratio(GPM_GRAPHICS_UTIL),
        sm_active=ratio(GPM_SM_UTIL),
        sm_occupancy=ratio(GPM_SM_OCCUPANCY),
        dram_active=ratio(GPM_DRAM_BW_UTIL),
        tensor_active=ratio(GPM_ANY_TENSOR_UTIL),
    )


@dataclass
class _Slot:
    """One card's or GI's samples: the previous one, a spare buffer, the last result."""

    previous: Any = None
    spare: Any = None
    taken_at: float = 0.0
    last: Activity | None = None
    buffers: list[Any] = field(default_factory=list)


class GpmSampler:
    """Two-sample GPM activity per card and per MIG GPU instance (see the module docstring).

    Passes come one at a time (the agent's loop; :meth:`prune` ends each), from worker
    threads; the lock keeps the buffers consistent should a close race a pass.
    """

    def __init__(
        self,
        nvml: Nvml,
        *,
        min_interval_s: float = MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._slots: dict[Key, _Slot] = {}
        self._supported: dict[str, bool] = {}
        self._refused: set[Key] = set()
        """Keys whose sampling answered "unsupported" (a MIG-mode card's whole-card sample may):
        not asked again until the card is forgotten."""
        self._seen: set[Key] = set()
        self._lock = threading.Lock()

    def supported(self, h: Handle, uuid: str) -> bool:
        """Whether ``uuid`` offers GPM (asked once per card; raises as the adapter does)."""
        with self._lock:
            known = self._supported.get(uuid)
        if known is None:
            known = self.nvml.gpm_supported(h)
            with self._lock:
                self._supported[uuid] = known
        return known

    def card(self, h: Handle, uuid: str) -> Activity | None:
        """The whole card's activity since the last pass; None without GPM or on a first pass."""
        if not self.supported(h, uuid):
            return None
        return self._sample((uuid, None, None), h, None)

    def instance(
        self, h: Handle, uuid: str, gpu_instance_id: int, profile: str | None
    ) -> Activity | None:
        """One MIG GPU instance's activity since the last pass (``h`` is the parent card's)."""
        if not self.supported(h, uuid):
            return None
        return self._sample((uuid, gpu_instance_id, profile), h, gpu_instance_id)

    def _sample(self, key: Key, h: Handle, gpu_instance_id: int | None) -> Activity | None:
        with self._lock:
            if key in self._refused:
                return None
            self._seen.add(key)
            slot = self._slots.setdefault(key, _Slot())
            now = self.clock()
            if slot.previous is not None and now - slot.taken_at < self.min_interval_s:
                return slot.last
            try:
                return self._advance(slot, h, gpu_instance_id, now)
            except NvmlError as e:
                self._free(self._slots.pop(key))
                if isinstance(e, NvmlUnsupported):
                    self._refused.add(key)
                raise

    def _advance(
        self, slot: _Slot, h: Handle, gpu_instance_id: int | None, now: float
    ) -> Activity | None:
        """Take a sample into the spare buffer; with a previous one, compute the interval."""
        if slot.spare is None:
            slot.spare = self.nvml.gpm_sample_alloc()
            slot.buffers.append(slot.spare)
        self.nvml.gpm_sample(h, slot.spare, gpu_instance_id)
        older, slot.previous, slot.taken_at = slot.previous, slot.spare, now
        slot.spare = older
        if older is None:
            return None
        slot.last = activity(self.nvml.gpm_metrics(older, slot.previous, METRICS))
        return slot.last

    def prune(self) -> None:
        """End a pass: free the samples of every key this pass did not ask for."""
        with self._lock:
            for key in [k for k in self._slots if k not in self._seen]:
                self._free(self._slots.pop(key))
            self._seen.clear()

    def forget(self, uuids: Iterable[str]) -> None:
        """Drop what is known of these cards (a card lost or replaced is asked afresh)."""
        gone = set(uuids)
        with self._lock:
            for key in [k for k in self._slots if k[0] in gone]:
                self._free(self._slots.pop(key))
            for uuid in gone:
                self._supported.pop(uuid, None)
            self._refused = {k for k in self._refused if k[0] not in gone}

    def close(self) -> None:
        """Free every sample buffer (NVML must be initialised: call inside a session)."""
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
            self._supported.clear()
            self._refused.clear()
            self._seen.clear()
        for slot in slots:
            self._free(slot)

    def held(self) -> int:
        """Sample buffers allocated and not yet freed."""
        with self._lock:
            return sum(len(s.buffers) for s in self._slots.values())

    def _free(self, slot: _Slot) -> None:
        for buffer in slot.buffers:
            try:
                self.nvml.gpm_sample_free(buffer)
            except NvmlError as e:
                log.debug("GPM sample free failed: %s", e)
        slot.buffers.clear()

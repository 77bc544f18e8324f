"""GPM (GPU Performance Monitoring) in the simulated NVML: counters sampled, rates from two.

A mixin of :class:`~agent.devices.simulation.fakenvml.SimulatedNvml`, with nvidia-ml-py's
names and shapes: ``nvmlGpmQueryDeviceSupport`` (Hopper on: ``architecture`` 9 or later),
``nvmlGpmSampleAlloc`` / ``nvmlGpmSampleFree`` (opaque integer buffers; a freed or unknown one
answers ``INVALID_ARGUMENT``), ``nvmlGpmSampleGet`` for a whole card (in MIG mode too) and
``nvmlGpmMigSampleGet`` for one existing GPU instance, and ``nvmlGpmMetricsGet`` over two
samples of the same card or instance, the older first.

Each sample advances its card's (or instance's) simulated clock by one tick and records running
totals of the activity percentages, so a rate is honestly ``(total2 - total1) / ticks``. The
activity is deterministic and moves from tick to tick, by -5..+5 points, around a level: a
whole card out of MIG mode sits at its utilization (the profile's ``utilizationPercent``, or its
load pattern's at the simulator's clock); a GPU instance at a
level derived from its id and slices; a card in MIG mode at its instances' slice-weighted mean
(0 with none carved: nothing can run). SM activity, occupancy, tensor-pipe activity
(``ANY_TENSOR_UTIL``) and DRAM bandwidth are fixed fractions of the engine's activity.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from agent.devices.simulation.fakemig import SimulatedGpuInstance, SimulatedHandle
from agent.devices.simulation.load import Reading
from agent.devices.simulation.nvmlerrors import INVALID_ARGUMENT, NOT_SUPPORTED, NVMLError
from agent.devices.simulation.profiles import NvidiaCard

HOPPER = 9

_GRAPHICS, _SM, _OCCUPANCY, _TENSOR, _DRAM = 1, 2, 3, 5, 10
_SHARES = {_GRAPHICS: 1.0, _SM: 0.8, _OCCUPANCY: 0.5, _TENSOR: 0.45, _DRAM: 0.6}
"""Each simulated metric as a fraction of the engine's activity."""


class c_nvmlGpmMetric_t(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", ctypes.c_double)]  # fmt: skip


class c_nvmlGpmMetricsGet_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.c_size_t),
        ("sample2", ctypes.c_size_t),
        ("metrics", c_nvmlGpmMetric_t * 32),
    ]


@dataclass(frozen=True)
class _Reading:
    """What one filled sample buffer holds."""

    source: tuple[int, int | None]
    """(card index, GPU instance id or None for the whole card)."""
    tick: int
    totals: dict[int, float]
    """Running totals of each metric's percentage, one term per tick."""


def _wobble(tick: int) -> int:
    return (tick * 7) % 11 - 5


def _gi_level(gi: SimulatedGpuInstance) -> int:
    return (37 * gi.id + 11 * gi.profile.slice_count) % 70 + 15


class GpmCalls:
    """The GPM part of the simulated pynvml module (see the module docstring)."""

    NVML_GPM_METRIC_GRAPHICS_UTIL = _GRAPHICS
    NVML_GPM_METRIC_SM_UTIL = _SM
    NVML_GPM_METRIC_SM_OCCUPANCY = _OCCUPANCY
    NVML_GPM_METRIC_DRAM_BW_UTIL = _DRAM
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = _TENSOR
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_SUPPORT_VERSION = 1
    c_nvmlGpmSample_t = ctypes.c_size_t
    c_nvmlGpmMetric_t = c_nvmlGpmMetric_t
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    cards: tuple[NvidiaCard, ...]
    _mig: threading.RLock
    _gis: dict[int, dict[int, SimulatedGpuInstance]]
    _gpm_buffers: dict[int, _Reading | None]
    """Allocated sample buffers -> what each holds (None: not filled yet)."""
    _gpm_sources: dict[tuple[int, int | None], tuple[int, dict[int, float]]]
    """(card index, GI id or None) -> (ticks so far, running totals per metric)."""
    _gpm_next: int

    def _card(self, fn: str, handle: Any, *aliases: str) -> NvidiaCard:
        raise NotImplementedError  # SimulatedNvml's

    def _system(self, fn: str) -> None:
        raise NotImplementedError  # SimulatedNvml's

    def _now(self, card: NvidiaCard) -> Reading:
        raise NotImplementedError  # SimulatedNvml's

    def gpm_buffers_alive(self) -> int:
        """Sample buffers allocated and not freed (tests check nothing leaks)."""
        with self._mig:
            return len(self._gpm_buffers)

    # -- the calls ----------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: SimulatedHandle) -> SimpleNamespace:
        card = self._card("nvmlGpmQueryDeviceSupport", device)
        supported = int((card.architecture or 0) >= HOPPER)
        return SimpleNamespace(version=self.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=supported)

    def nvmlGpmSampleAlloc(self) -> int:
        self._system("nvmlGpmSampleAlloc")
        with self._mig:
            buffers = self._gpm_buffers
            handle = self._gpm_next
            self._gpm_next += 1
            buffers[handle] = None
            return handle

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._system("nvmlGpmSampleFree")
        with self._mig:
            buffers = self._gpm_buffers
            if int(gpmSample) not in buffers:
                raise NVMLError(INVALID_ARGUMENT)  # never allocated, or freed already
            del buffers[int(gpmSample)]

    def nvmlGpmSampleGet(self, device: SimulatedHandle, gpmSample: Any) -> Any:
        card = self._card("nvmlGpmSampleGet", device)
        with self._mig:
            self._fill(card, device.index, None, gpmSample)
        return gpmSample

    def nvmlGpmMigSampleGet(
        self, device: SimulatedHandle, gpuInstanceId: int, gpmSample: Any
    ) -> Any:
        card = self._card("nvmlGpmMigSampleGet", device)
        if not card.mig_mode:
            raise NVMLError(NOT_SUPPORTED)
        with self._mig:
            if gpuInstanceId not in self._gis.get(device.index, {}):
                raise NVMLError(INVALID_ARGUMENT)  # no such GPU instance (destroyed)
            self._fill(card, device.index, gpuInstanceId, gpmSample)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._system("nvmlGpmMetricsGet")
        request = getattr(metricsGet, "_obj", metricsGet)  # byref() or the struct itself
        with self._mig:
            buffers = self._gpm_buffers
            older = buffers.get(int(request.sample1))
            newer = buffers.get(int(request.sample2))
        if (
            request.version != self.NVML_GPM_METRICS_GET_VERSION
            or older is None
            or newer is None
            or older.source != newer.source
            or newer.tick <= older.tick
        ):
            raise NVMLError(INVALID_ARGUMENT)
        ticks = newer.tick - older.tick
        for i in range(int(request.numMetrics)):
            metric = request.metrics[i]
            if metric.metricId not in _SHARES:
                metric.nvmlReturn, metric.value = NOT_SUPPORTED, 0.0
                continue
            delta = newer.totals[metric.metricId] - older.totals[metric.metricId]
            metric.nvmlReturn, metric.value = 0, delta / ticks
        return metricsGet

    # -- the simulated counters ---------------------------------------------------------------

    def _fill(self, card: NvidiaCard, index: int, gi: int | None, gpmSample: Any) -> None:
        """Called with ``_mig`` held: advance the source's clock, record it in the buffer."""
        if (card.architecture or 0) < HOPPER:
            raise NVMLError(NOT_SUPPORTED)
        buffers, sources = self._gpm_buffers, self._gpm_sources
        if int(gpmSample) not in buffers:
            raise NVMLError(INVALID_ARGUMENT)  # never allocated, or freed
        tick, totals = sources.get((index, gi), (0, dict.fromkeys(_SHARES, 0.0)))
        tick += 1
        level = self._level(card, index, gi)
        engine = 0.0 if level is None else min(max(level + _wobble(tick + index), 0), 100)
        totals = {m: totals[m] + engine * share for m, share in _SHARES.items()}
        sources[(index, gi)] = (tick, totals)
        buffers[int(gpmSample)] = _Reading((index, gi), tick, totals)

    def _level(self, card: NvidiaCard, index: int, gi: int | None) -> float | None:
        """The engine's activity level, percent, around which the samples move (None: idle)."""
        instances = self._gis.get(index, {})
        if gi is not None:
            return _gi_level(instances[gi])
        if not card.mig_mode:
            return self._now(card).utilization_percent  # a load pattern moves it
        if not instances:
            return None  # nothing carved: nothing can run
        slices = max((p.slice_count for p in card.mig_profiles), default=1)
        return sum(_gi_level(g) * g.profile.slice_count for g in instances.values()) / slices

"""The NVML adapter: the one module that talks to ``pynvml``.

Every NVML call the agent makes goes through :class:`Nvml`, which returns plain Python values and
maps NVML's return codes to our own errors, named for what the caller should do:

- :class:`NvmlUnsupported`: the card or driver does not offer this value (``NOT_SUPPORTED``,
  ``NO_PERMISSION``, ``FUNCTION_NOT_FOUND``, or a symbol the binding lacks). Drop the field.
- :class:`NvmlGpuLost`: the card fell off the bus. Stop asking it anything; report it unhealthy.
- :class:`NvmlUnavailable`: no NVML here at all (library absent, driver not loaded).
- :class:`NvmlCallFailed`: anything else, with the call and the code name.
- MIG management adds three refinements: :class:`NvmlNoRoom` (``INSUFFICIENT_RESOURCES``: the
  placement is taken or the card is full), :class:`NvmlInUse` (``IN_USE``: a process still uses
  the instance; retry later) and :class:`NvmlNotPermitted` (``NO_PERMISSION``: MIG management
  needs root; a subclass of :class:`NvmlUnsupported`, so detection still just drops the field).

The adapter is three modules, and callers import only this one, which re-exports the rest:
:mod:`agent.devices.libs.nvmlcalls` (return codes, the error types and the call that maps one to
the other), :mod:`agent.devices.libs.nvmlmig` (MIG profiles, placements and instances: a base of
:class:`Nvml`) and this one (identity, capability, locality, usage, GPM and XID events).

The library is the real ``pynvml`` module (imported on first construction, so importing this
module costs nothing) or a pynvml-compatible simulator. Only ``library.NVMLError`` and its int
``.value`` are relied on, which both share.

Init is never cached: each pass opens its own :meth:`Nvml.session`, so a driver that loads after
the agent starts is found on the next pass. nvidia-ml-py reference-counts init, so every
successful init is paired with a shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agent.devices import pci
from agent.devices.libs.nvmlcalls import (
    ABSENT,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    TIMEOUT,
    Handle,
    NvmlCallFailed,
    NvmlError,
    NvmlGpuLost,
    NvmlInUse,
    NvmlNoRoom,
    NvmlNotPermitted,
    NvmlUnavailable,
    NvmlUnsupported,
    map_error,
    text,
)
from agent.devices.libs.nvmlmig import (
    ComputeInstance,
    GpuInstance,
    GpuInstanceProfile,
    MigCalls,
    MigDevice,
)

__all__ = [
    "GPM_ANY_TENSOR_UTIL",
    "GPM_DRAM_BW_UTIL",
    "GPM_GRAPHICS_UTIL",
    "GPM_SM_OCCUPANCY",
    "GPM_SM_UTIL",
    "NOT_FOUND",
    "ComputeInstance",
    "GpuInstance",
    "GpuInstanceProfile",
    "Handle",
    "MemoryInfo",
    "MigDevice",
    "Nvml",
    "NvmlCallFailed",
    "NvmlError",
    "NvmlGpuLost",
    "NvmlInUse",
    "NvmlNoRoom",
    "NvmlNotPermitted",
    "NvmlUnavailable",
    "NvmlUnsupported",
    "XidEvent",
    "map_error",
]

log = logging.getLogger(__name__)

_FIELD_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
"""``nvmlValueType_t`` -> the member of the ``nvmlValue_t`` union that holds the value."""

EVENT_TYPE_XID_CRITICAL_ERROR = 0x0000000000000008
"""``nvmlEventTypeXidCriticalError``: the only event type the health watcher registers."""

GPM_GRAPHICS_UTIL = 1
"""``NVML_GPM_METRIC_GRAPHICS_UTIL``: percent of time the graphics/compute engine was busy."""
GPM_SM_UTIL = 2
"""``NVML_GPM_METRIC_SM_UTIL``: percent of SMs busy."""
GPM_SM_OCCUPANCY = 3
"""``NVML_GPM_METRIC_SM_OCCUPANCY``: percent of resident warps against the SMs' maximum."""
GPM_ANY_TENSOR_UTIL = 5
"""``NVML_GPM_METRIC_ANY_TENSOR_UTIL``: percent of the tensor (HMMA/IMMA/DMMA) pipes' peak used
(DCGM's ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``)."""
GPM_DRAM_BW_UTIL = 10
"""``NVML_GPM_METRIC_DRAM_BW_UTIL``: percent of the peak DRAM bandwidth used."""

CPU_SET_WORDS = 64
"""64-bit words asked for in CPU affinity masks: room for 4096 CPUs."""
NODE_SET_WORDS = 4
"""64-bit words asked for in NUMA-node affinity masks: room for 256 nodes."""


@dataclass(frozen=True)
class MemoryInfo:
    """Frame-buffer bytes; ``reserved`` is None where only NVML's v1 call exists (there
    ``used`` includes it)."""

    total: int
    used: int
    free: int
    reserved: int | None


@dataclass(frozen=True)
class XidEvent:
    """One XID critical-error event as ``nvmlEventSetWait`` delivered it."""

    handle: Handle
    """The card the event is about (ask :meth:`Nvml.uuid` which one)."""
    xid: int
    """The XID code (the event's ``eventData``)."""


class Nvml(MigCalls):
    """NVML calls returning plain values; every failure is one of the :class:`NvmlError` types.

    ``errors_by_call`` counts the errors raised per NVML function name, for the agent's metrics.
    The MIG methods come from :class:`~agent.devices.libs.nvmlmig.MigCalls`.
    """

    def __init__(self, library: Any = None) -> None:
        if library is None:
            import pynvml

            library = pynvml
        super().__init__(library)

    # -- lifecycle ----------------------------------------------------------------------------

    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    @contextmanager
    def session(self) -> Iterator[Nvml]:
        """Init NVML for one pass and always shut it down, even when the pass raised.

        A failed init raises before anything is yielded and leaves nothing to shut down. A failed
        shutdown is logged, not raised, so it cannot hide the pass's own outcome.
        """
        self.init()
        try:
            yield self
        finally:
            try:
                self.shutdown()
            except NvmlError as e:
                log.warning("NVML shutdown failed: %s", e)

    # -- system -------------------------------------------------------------------------------

    def driver_version(self) -> str:
        return text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        """``major*1000 + minor*10``: ``12080`` is CUDA 12.8."""
        return int(self._call("nvmlSystemGetCudaDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> Handle:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # -- identity -----------------------------------------------------------------------------

    def uuid(self, h: Handle) -> str:
        return text(self._call("nvmlDeviceGetUUID", h))

    def name(self, h: Handle) -> str:
        return text(self._call("nvmlDeviceGetName", h))

    def minor_number(self, h: Handle) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", h))

    def pci_bus_id(self, h: Handle) -> str:
        """The card's PCI address as lowercase ``dddd:bb:dd.f`` (``busIdLegacy`` preferred)."""
        info = self._call("nvmlDeviceGetPciInfo", h)
        raw = text(getattr(info, "busIdLegacy", b"")) or text(info.busId)
        return pci.normalize_bdf(raw)

    # -- capability ---------------------------------------------------------------------------

    def memory(self, h: Handle) -> tuple[int, int]:
        """``(total, used)`` bytes; v2 first, whose ``used`` excludes driver-reserved memory.

        Falls back to v1 only when v2 is unsupported (old drivers lack the ``_v2`` symbol); a lost
        card or another failure of v2 is raised as is.
        """
        try:
            info = self._call("nvmlDeviceGetMemoryInfo", h, version=self.library.nvmlMemory_v2)
        except NvmlUnsupported:
            info = self._call("nvmlDeviceGetMemoryInfo", h)
        return int(info.total), int(info.used)

    def num_cores(self, h: Handle) -> int:
        """CUDA cores (not SMs)."""
        return int(self._call("nvmlDeviceGetNumGpuCores", h))

    def compute_capability(self, h: Handle) -> tuple[int, int]:
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", h)
        return int(major), int(minor)

    def architecture(self, h: Handle) -> int:
        """NVML's ``nvmlDeviceArchitecture_t`` (9 = Hopper)."""
        return int(self._call("nvmlDeviceGetArchitecture", h))

    # -- locality -----------------------------------------------------------------------------

    def cpu_affinity(self, h: Handle) -> list[int]:
        words = self._call("nvmlDeviceGetCpuAffinity", h, CPU_SET_WORDS)
        return pci.bits_to_numbers(int(w) for w in words)

    def memory_affinity(self, h: Handle) -> list[int]:
        scope = self.library.NVML_AFFINITY_SCOPE_NODE
        words = self._call("nvmlDeviceGetMemoryAffinity", h, NODE_SET_WORDS, scope)
        return pci.bits_to_numbers(int(w) for w in words)

    # -- usage --------------------------------------------------------------------------------

    def utilization(self, h: Handle) -> int:
        """Percent of time a kernel ran over the last sample period."""
        return int(self._call("nvmlDeviceGetUtilizationRates", h).gpu)

    def temperature(self, h: Handle) -> int:
        """GPU core temperature, °C."""
        return int(self._call("nvmlDeviceGetTemperature", h, self.library.NVML_TEMPERATURE_GPU))

    def power_usage(self, h: Handle) -> int:
        """Power drawn, mW."""
        return int(self._call("nvmlDeviceGetPowerUsage", h))

    # -- the DCGM exporter's default fields that NVML gives (docs/metrics.md) -------------------

    def memory_info(self, h: Handle) -> MemoryInfo:
        """Total, used, free and (v2 only) driver-reserved bytes; total includes reserved."""
        try:
            info = self._call("nvmlDeviceGetMemoryInfo", h, version=self.library.nvmlMemory_v2)
            reserved: int | None = int(info.reserved)
        except NvmlUnsupported:
            info, reserved = self._call("nvmlDeviceGetMemoryInfo", h), None
        return MemoryInfo(int(info.total), int(info.used), int(info.free), reserved)

    def memory_copy_utilization(self, h: Handle) -> int:
        """Percent of time memory was read or written over the last sample period."""
        return int(self._call("nvmlDeviceGetUtilizationRates", h).memory)

    def encoder_utilization(self, h: Handle) -> int:
        return int(self._call("nvmlDeviceGetEncoderUtilization", h)[0])

    def decoder_utilization(self, h: Handle) -> int:
        return int(self._call("nvmlDeviceGetDecoderUtilization", h)[0])

    def sm_clock(self, h: Handle) -> int:
        """MHz."""
        return int(self._call("nvmlDeviceGetClockInfo", h, self.library.NVML_CLOCK_SM))

    def memory_clock(self, h: Handle) -> int:
        """MHz."""
        return int(self._call("nvmlDeviceGetClockInfo", h, self.library.NVML_CLOCK_MEM))

    def total_energy(self, h: Handle) -> int:
        """Millijoules since the driver was last loaded."""
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", h))

    def pcie_throughput(self, h: Handle) -> tuple[int, int]:
        """``(tx, rx)`` KB/s over the driver's last 20 ms window."""
        tx = self._call("nvmlDeviceGetPcieThroughput", h, self.library.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._call("nvmlDeviceGetPcieThroughput", h, self.library.NVML_PCIE_UTIL_RX_BYTES)
        return int(tx), int(rx)

    def pcie_replays(self, h: Handle) -> int:
        return int(self._call("nvmlDeviceGetPcieReplayCounter", h))

    def remapped_rows(self, h: Handle) -> tuple[int, int, bool]:
        """``(correctable, uncorrectable, failed)`` row remappings (Ampere and later)."""
        corrected, uncorrected, _pending, failed = self._call("nvmlDeviceGetRemappedRows", h)
        return int(corrected), int(uncorrected), bool(failed)

    def retired_pages(self, h: Handle) -> tuple[int, int]:
        """``(single-bit, double-bit)`` retired pages (cards before row remapping)."""
        lib = self.library
        single = self._call(
            "nvmlDeviceGetRetiredPages",
            h,
            lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        double = self._call(
            "nvmlDeviceGetRetiredPages", h, lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        return len(single), len(double)

    def nvlink_links_up(self, h: Handle) -> int:
        """How many NVLink links are up; :class:`NvmlUnsupported` when the card has none.

        Links are asked in order until the card says there is no such link.
        """
        absent = frozenset({NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND})
        up = 0
        for link in range(int(getattr(self.library, "NVML_NVLINK_MAX_LINKS", 18))):
            state = self._call_unless(absent, "nvmlDeviceGetNvLinkState", h, link)
            if state is ABSENT:
                if link == 0:
                    raise NvmlUnsupported("nvmlDeviceGetNvLinkState", NOT_SUPPORTED, "no NVLink")
                break
            up += int(state) == 1  # NVML_FEATURE_ENABLED
        return up

    def nvlink_data(self, h: Handle) -> tuple[int, int]:
        """``(tx, rx)`` KiB of data over every NVLink link since the driver loaded."""
        lib = self.library
        ids = [lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
        tx, rx = self._fields(h, ids, "NVLink data")
        return int(tx), int(rx)

    def memory_temperature(self, h: Handle) -> int:
        """Memory (HBM) temperature, °C."""
        (value,) = self._fields(h, [self.library.NVML_FI_DEV_MEMORY_TEMP], "memory temperature")
        return int(value)

    def _fields(self, h: Handle, ids: list[int], what: str) -> list[float]:
        """``nvmlDeviceGetFieldValues``: each value read as its own type says; a field the card
        lacks raises as the call would (``NOT_SUPPORTED`` is :class:`NvmlUnsupported`)."""
        out: list[float] = []
        for v in self._call("nvmlDeviceGetFieldValues", h, ids):
            code = int(v.nvmlReturn)
            if code != 0:
                if code != NOT_SUPPORTED:
                    self.errors_by_call["nvmlDeviceGetFieldValues"] += 1
                raise map_error("nvmlDeviceGetFieldValues", code, what)
            member = _FIELD_MEMBERS.get(int(getattr(v, "valueType", 3)), "ullVal")
            out.append(getattr(v.value, member))
        return out

    # -- GPM: GPU Performance Monitoring (Hopper on; see agent/devices/gpm.py) -----------------

    def gpm_supported(self, h: Handle) -> bool:
        """Whether the card offers GPM; a card or driver without the call answers False."""
        try:
            support = self._call("nvmlGpmQueryDeviceSupport", h)
        except NvmlUnsupported:
            return False
        return bool(support.isSupportedDevice)

    def gpm_sample_alloc(self) -> Any:
        """A new sample buffer; hand it back to :meth:`gpm_sample_free`."""
        return self._call("nvmlGpmSampleAlloc")

    def gpm_sample_free(self, sample: Any) -> None:
        self._call("nvmlGpmSampleFree", sample)

    def gpm_sample(self, h: Handle, sample: Any, gpu_instance_id: int | None = None) -> None:
        """Fill ``sample`` with the card's counters now, or one MIG GPU instance's."""
        if gpu_instance_id is None:
            self._call("nvmlGpmSampleGet", h, sample)
        else:
            self._call("nvmlGpmMigSampleGet", h, gpu_instance_id, sample)

    def gpm_metrics(self, older: Any, newer: Any, ids: tuple[int, ...]) -> dict[int, float]:
        """GPM metrics (``GPM_*``) over the interval between two samples of one card or GI.

        A metric the card cannot compute is left out, uncounted; the call itself failing
        raises as usual.
        """
        request = self.library.c_nvmlGpmMetricsGet_t()
        request.version = int(getattr(self.library, "NVML_GPM_METRICS_GET_VERSION", 1))
        request.numMetrics = len(ids)
        request.sample1, request.sample2 = older, newer
        for i, metric in enumerate(ids):
            request.metrics[i].metricId = metric
        got = self._call("nvmlGpmMetricsGet", request)
        out: dict[int, float] = {}
        for i, metric in enumerate(ids):
            answer = got.metrics[i]
            if int(answer.nvmlReturn) == 0:
                out[metric] = float(answer.value)
        return out

    # -- events -------------------------------------------------------------------------------

    def event_set_create(self) -> Any:
        """A new, empty NVML event set; free it with :meth:`event_set_free`."""
        return self._call("nvmlEventSetCreate")

    def register_xid_events(self, h: Handle, event_set: Any) -> None:
        """Deliver ``h``'s XID critical errors to ``event_set``.

        :raises NvmlUnsupported: the card has no event support (old GPUs); it gets no XID watch.
        """
        self._call("nvmlDeviceRegisterEvents", h, EVENT_TYPE_XID_CRITICAL_ERROR, event_set)

    def wait_xid(self, event_set: Any, timeout_ms: int) -> XidEvent | None:
        """The next XID event, or None when none arrived within ``timeout_ms``.

        A timeout is the normal outcome of a quiet card, so it is not counted as an error.
        :raises NvmlGpuLost, NvmlCallFailed: the wait itself failed.
        """
        data = self._call_unless(frozenset({TIMEOUT}), "nvmlEventSetWait", event_set, timeout_ms)
        if data is ABSENT or not int(data.eventType) & EVENT_TYPE_XID_CRITICAL_ERROR:
            return None
        return XidEvent(handle=data.device, xid=int(data.eventData))

    def event_set_free(self, event_set: Any) -> None:
        self._call("nvmlEventSetFree", event_set)

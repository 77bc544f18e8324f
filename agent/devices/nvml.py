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

MIG instances (GPU instance + compute instance) are created, listed and destroyed by the
``*_instance*`` methods; a MIG device is named by its ``MIG-`` UUID, found by walking the card's
MIG device slots (:meth:`Nvml.mig_devices`) and matching the GI and CI ids, because slot numbers
shift when a sibling is destroyed.

The library is the real ``pynvml`` module (imported on first construction, so importing this
module costs nothing) or a pynvml-compatible simulator. Only ``library.NVMLError`` and its int
``.value`` are relied on, which both share.

Init is never cached: each pass opens its own :meth:`Nvml.session`, so a driver that loads after
the agent starts is found on the next pass. nvidia-ml-py reference-counts init, so every
successful init is paired with a shutdown.
"""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agent.devices import pci
from agent.errors import AgentError

log = logging.getLogger(__name__)

Handle = Any
"""An opaque NVML device handle (a ctypes pointer for the real library)."""

# NVML return codes (nvml.h); the simulator uses the same numbers.
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999

CODE_NAMES: dict[int, str] = {
    UNINITIALIZED: "UNINITIALIZED",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NOT_SUPPORTED: "NOT_SUPPORTED",
    NO_PERMISSION: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    NOT_FOUND: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    DRIVER_NOT_LOADED: "DRIVER_NOT_LOADED",
    TIMEOUT: "TIMEOUT",
    11: "IRQ_ISSUE",
    LIBRARY_NOT_FOUND: "LIBRARY_NOT_FOUND",
    FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    GPU_IS_LOST: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    IN_USE: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    INSUFFICIENT_RESOURCES: "INSUFFICIENT_RESOURCES",
    UNKNOWN: "UNKNOWN",
}

_UNSUPPORTED_CODES = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND})
_UNAVAILABLE_CODES = frozenset({LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED})
_PROFILE_ABSENT_CODES = frozenset({NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND})
"""What a GI-profile scan gets for a profile index this card does not have: skip it, silently."""

_ABSENT: Any = object()
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
"""What :meth:`Nvml._call_unless` returns for an expected "nothing here" code."""

EVENT_TYPE_XID_CRITICAL_ERROR = 0x0000000000000008
"""``nvmlEventTypeXidCriticalError``: the only event type the health watcher registers."""

GPM_GRAPHICS_UTIL = 1
"""``NVML_GPM_METRIC_GRAPHICS_UTIL``: percent of time the graphics/compute engine was busy."""
GPM_SM_UTIL = 2
"""``NVML_GPM_METRIC_SM_UTIL``: percent of SMs busy."""
GPM_SM_OCCUPANCY = 3
"""``NVML_GPM_METRIC_SM_OCCUPANCY``: percent of resident warps against the SMs' maximum."""
GPM_DRAM_BW_UTIL = 10
"""``NVML_GPM_METRIC_DRAM_BW_UTIL``: percent of the peak DRAM bandwidth used."""

CPU_SET_WORDS = 64
"""64-bit words asked for in CPU affinity masks: room for 4096 CPUs."""
NODE_SET_WORDS = 4
"""64-bit words asked for in NUMA-node affinity masks: room for 256 nodes."""


class NvmlError(AgentError):
    """An NVML call failed; ``call`` names it, ``code`` is NVML's return code."""

    def __init__(self, call: str, code: int, detail: str) -> None:
        self.call = call
        self.code = code
        self.code_name = CODE_NAMES.get(code, f"ERROR_{code}")
        self.detail = detail
        super().__init__(f"{call}: {detail} ({self.code_name})")


class NvmlUnsupported(NvmlError):
    """This value is not available from this card or driver; only its field is lost."""


class NvmlGpuLost(NvmlError):
    """The card no longer answers (fell off the bus); it must not be asked again this pass."""


class NvmlUnavailable(NvmlError):
    """NVML cannot be used at all here: the library is absent or the driver is not loaded."""


class NvmlCallFailed(NvmlError):
    """Any other NVML failure."""


class NvmlNotPermitted(NvmlUnsupported):
    """The caller lacks the privilege (MIG management needs root); detection drops the field."""


class NvmlNoRoom(NvmlCallFailed):
    """``INSUFFICIENT_RESOURCES``: the placement overlaps an instance, or the card is full."""


class NvmlInUse(NvmlCallFailed):
    """``IN_USE``: the instance is busy (a process, or compute instances inside); retry later."""


def map_error(call: str, code: int, detail: str) -> NvmlError:
    """Choose the error type for an NVML return code (pure, so tests can pin the table)."""
    if code == NO_PERMISSION:
        return NvmlNotPermitted(call, code, detail)
    if code in _UNSUPPORTED_CODES:
        return NvmlUnsupported(call, code, detail)
    if code == INSUFFICIENT_RESOURCES:
        return NvmlNoRoom(call, code, detail)
    if code == IN_USE:
        return NvmlInUse(call, code, detail)
    if code == GPU_IS_LOST:
        return NvmlGpuLost(call, code, detail)
    if code in _UNAVAILABLE_CODES:
        return NvmlUnavailable(call, code, detail)
    return NvmlCallFailed(call, code, detail)


@dataclass(frozen=True)
class GpuInstanceProfile:
    """One MIG GPU-instance profile of a card, as NVML reports it on an empty card."""

    index: int
    """The NVML profile index scanned (``NVML_GPU_INSTANCE_PROFILE_1_SLICE`` = 0, ...)."""
    name: str
    """Without NVML's ``MIG`` prefix: ``1g.10gb``, ``1g.10gb+me``."""
    memory_mib: int
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    placements: tuple[tuple[int, int], ...]
    """Legal ``(start, size)`` placements in memory slices; empty when there are none."""


@dataclass(frozen=True)
class GpuInstance:
    """One existing MIG GPU instance of a card."""

    handle: Handle
    id: int
    profile_id: int
    start: int
    size: int
    """Memory slices ``[start, start + size)`` it occupies."""


@dataclass(frozen=True)
class ComputeInstance:
    """One compute instance inside a GPU instance."""

    handle: Handle
    id: int
    profile_id: int


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance as CUDA sees it), named by its ``MIG-`` UUID."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    handle: Handle = None
    """The MIG device's own handle (memory, as that instance sees it)."""


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


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00").strip()
    return str(value).strip()


class Nvml:
    """NVML calls returning plain values; every failure is one of the :class:`NvmlError` types.

    ``errors_by_call`` counts the errors raised per NVML function name, for the agent's metrics.
    """

    def __init__(self, library: Any = None) -> None:
        if library is None:
            import pynvml

            library = pynvml
        self.library: Any = library
        self.errors_by_call: Counter[str] = Counter()

    # -- plumbing -----------------------------------------------------------------------------

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``library.<name>`` and map its failure; an absent symbol is "unsupported"."""
        fn: Callable[..., Any] | None = getattr(self.library, name, None)
        if fn is None:
            self.errors_by_call[name] += 1
            raise NvmlUnsupported(name, FUNCTION_NOT_FOUND, "not found in the NVML binding")
        try:
            return fn(*args, **kwargs)
        except self.library.NVMLError as e:
            if int(e.value) != NOT_SUPPORTED:  # "this card has no such value": not an error
                self.errors_by_call[name] += 1
            raise map_error(name, int(e.value), str(e)) from e

    def _call_unless(self, absent: frozenset[int], name: str, *args: Any) -> Any:
        """Like :meth:`_call`, but a code in ``absent`` returns :data:`_ABSENT`, uncounted."""
        fn: Callable[..., Any] | None = getattr(self.library, name, None)
        if fn is None:
            self.errors_by_call[name] += 1
            raise NvmlUnsupported(name, FUNCTION_NOT_FOUND, "not found in the NVML binding")
        try:
            return fn(*args)
        except self.library.NVMLError as e:
            if int(e.value) in absent:
                return _ABSENT
            self.errors_by_call[name] += 1
            raise map_error(name, int(e.value), str(e)) from e

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
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        """``major*1000 + minor*10``: ``12080`` is CUDA 12.8."""
        return int(self._call("nvmlSystemGetCudaDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> Handle:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # -- identity -----------------------------------------------------------------------------

    def uuid(self, h: Handle) -> str:
        return _text(self._call("nvmlDeviceGetUUID", h))

    def name(self, h: Handle) -> str:
        return _text(self._call("nvmlDeviceGetName", h))

    def minor_number(self, h: Handle) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", h))

    def pci_bus_id(self, h: Handle) -> str:
        """The card's PCI address as lowercase ``dddd:bb:dd.f`` (``busIdLegacy`` preferred)."""
        info = self._call("nvmlDeviceGetPciInfo", h)
        raw = _text(getattr(info, "busIdLegacy", b"")) or _text(info.busId)
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

    def mig_mode(self, h: Handle) -> bool:
        """The *current* MIG mode (a pending change takes effect only after a reset).

        A card that is not MIG-capable answers NOT_SUPPORTED: that is "off", not a failure.
        """
        got = self._call_unless(frozenset({NOT_SUPPORTED}), "nvmlDeviceGetMigMode", h)
        if got is _ABSENT:
            return False
        current, _pending = got
        return bool(current)

    def gpu_instance_profiles(self, h: Handle) -> tuple[GpuInstanceProfile, ...]:
        """Scan every GI profile index; indexes this card lacks are skipped.

        Raises :class:`NvmlUnsupported` when the v2 profile call itself is unavailable (no name
        without it), and :class:`NvmlGpuLost` / :class:`NvmlCallFailed` as usual.
        """
        profiles = []
        for index in range(int(self.library.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            info = self._profile_info(h, index)
            if info is None:
                continue
            name = _text(info.name).removeprefix("MIG ").strip()
            profiles.append(
                GpuInstanceProfile(
                    index=index,
                    name=name,
                    memory_mib=int(info.memorySizeMB),
                    slice_count=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    multiprocessor_count=int(info.multiprocessorCount),
                    placements=self.placements(h, int(info.id)),
                )
            )
        return tuple(profiles)

    def _profile_info(self, h: Handle, index: int) -> Any:
        name = "nvmlDeviceGetGpuInstanceProfileInfo"
        fn: Callable[..., Any] | None = getattr(self.library, name, None)
        if fn is None:
            raise NvmlUnsupported(name, FUNCTION_NOT_FOUND, "not found in the NVML binding")
        try:
            return fn(h, index)
        except self.library.NVMLError as e:
            code = int(e.value)
            if code in _PROFILE_ABSENT_CODES:
                return None
            self.errors_by_call[name] += 1
            raise map_error(name, code, str(e)) from e

    def placements(self, h: Handle, profile_id: int) -> tuple[tuple[int, int], ...]:
        """Legal ``(start, size)`` placements of a GI profile on an empty card.

        The binding takes a ctypes array and a count pointer (the ``_v2`` C call): one call with
        no array gets the count, a second fills the array.
        """
        count = ctypes.c_uint(0)
        name = "nvmlDeviceGetGpuInstancePossiblePlacements"
        self._call(name, h, profile_id, None, ctypes.pointer(count))
        if count.value == 0:
            return ()
        array = (self.library.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(name, h, profile_id, array, ctypes.pointer(count))
        return tuple((int(p.start), int(p.size)) for p in array[: count.value])

    # -- MIG management (needs root on real hardware) -----------------------------------------

    def handle_by_uuid(self, uuid: str) -> Handle:
        return self._call("nvmlDeviceGetHandleByUUID", uuid.encode())

    def create_gpu_instance(self, h: Handle, profile_id: int, start: int, size: int) -> GpuInstance:
        """Create a GI of ``profile_id`` at memory slices ``[start, start + size)``.

        :raises NvmlNoRoom: the placement overlaps an instance or the card has no room left.
        :raises NvmlNotPermitted: not root.
        """
        placement = self.library.c_nvmlGpuInstancePlacement_t(start, size)
        gi = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement", h, profile_id, ctypes.pointer(placement)
        )
        return self.gpu_instance_info(gi)

    def gpu_instance_info(self, gi: Handle) -> GpuInstance:
        info = self._call("nvmlGpuInstanceGetInfo", gi)
        return GpuInstance(
            handle=gi,
            id=int(info.id),
            profile_id=int(info.profileId),
            start=int(info.placement.start),
            size=int(info.placement.size),
        )

    def gpu_instances(self, h: Handle, profile_id: int, capacity: int) -> tuple[GpuInstance, ...]:
        """The existing GIs of one profile; ``capacity`` is the profile's ``instance_count``."""
        if capacity <= 0:
            return ()
        array = (self.library.c_nvmlGpuInstance_t * capacity)()
        count = ctypes.c_uint(0)
        self._call("nvmlDeviceGetGpuInstances", h, profile_id, array, ctypes.pointer(count))
        return tuple(self.gpu_instance_info(array[i]) for i in range(count.value))

    def create_compute_instance(self, gi: Handle, slice_count: int) -> ComputeInstance:
        """One compute instance spanning the whole GI (the CI profile with its slice count)."""
        profile_id = self._whole_ci_profile(gi, slice_count)
        ci = self._call("nvmlGpuInstanceCreateComputeInstance", gi, profile_id)
        return self.compute_instance_info(ci)

    def _whole_ci_profile(self, gi: Handle, slice_count: int) -> int:
        """The CI profile id whose slice count is the GI's (else the largest that fits)."""
        name = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        best: tuple[int, int] | None = None
        shared = int(getattr(self.library, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
        for index in range(int(self.library.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            info = self._call_unless(_PROFILE_ABSENT_CODES, name, gi, index, shared)
            if info is _ABSENT:
                continue
            slices = int(info.sliceCount)
            if slices <= slice_count and (best is None or slices > best[0]):
                best = (slices, int(info.id))
        if best is None:
            raise NvmlCallFailed(name, NOT_FOUND, f"no compute profile fits {slice_count} slices")
        return best[1]

    def compute_instance_info(self, ci: Handle) -> ComputeInstance:
        info = self._call("nvmlComputeInstanceGetInfo", ci)
        return ComputeInstance(handle=ci, id=int(info.id), profile_id=int(info.profileId))

    def compute_instances(self, gi: Handle) -> tuple[ComputeInstance, ...]:
        """Every compute instance inside ``gi``, of any CI profile."""
        found: list[ComputeInstance] = []
        for profile_id in range(int(self.library.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            array = (self.library.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(0)
            name = "nvmlGpuInstanceGetComputeInstances"
            args = (gi, profile_id, array, ctypes.pointer(count))
            if self._call_unless(_PROFILE_ABSENT_CODES, name, *args) is _ABSENT:
                continue  # a CI profile this GI does not offer
            found.extend(self.compute_instance_info(array[i]) for i in range(count.value))
        return tuple(found)

    def destroy_compute_instance(self, ci: Handle) -> None:
        """:raises NvmlInUse: a process still runs on it."""
        self._call("nvmlComputeInstanceDestroy", ci)

    def destroy_gpu_instance(self, gi: Handle) -> None:
        """:raises NvmlInUse: compute instances (or processes) remain inside it."""
        self._call("nvmlGpuInstanceDestroy", gi)

    def mig_devices(self, h: Handle) -> tuple[MigDevice, ...]:
        """Every MIG device of a card, by walking its slots (an empty slot is skipped)."""
        found: list[MigDevice] = []
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", h))):
            absent = frozenset({NOT_FOUND, INVALID_ARGUMENT})
            mig = self._call_unless(absent, "nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
            if mig is _ABSENT:
                continue  # an empty slot
            found.append(
                MigDevice(
                    uuid=self.uuid(mig),
                    gpu_instance_id=int(self._call("nvmlDeviceGetGpuInstanceId", mig)),
                    compute_instance_id=int(self._call("nvmlDeviceGetComputeInstanceId", mig)),
                    handle=mig,
                )
            )
        return tuple(found)

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
            if state is _ABSENT:
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
        name = "nvmlEventSetWait"
        fn: Callable[..., Any] | None = getattr(self.library, name, None)
        if fn is None:
            self.errors_by_call[name] += 1
            raise NvmlUnsupported(name, FUNCTION_NOT_FOUND, "not found in the NVML binding")
        try:
            data = fn(event_set, timeout_ms)
        except self.library.NVMLError as e:
            if int(e.value) == TIMEOUT:
                return None
            self.errors_by_call[name] += 1
            raise map_error(name, int(e.value), str(e)) from e
        if not int(data.eventType) & EVENT_TYPE_XID_CRITICAL_ERROR:
            return None
        return XidEvent(handle=data.device, xid=int(data.eventData))

    def event_set_free(self, event_set: Any) -> None:
        self._call("nvmlEventSetFree", event_set)

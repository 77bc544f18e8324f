"""A pynvml-compatible NVML built from a profile, so the NVIDIA backend runs without a GPU.

:class:`SimulatedNvml` offers the subset of nvidia-ml-py that :mod:`agent.devices.libs.nvml` uses, with
the same function names, signatures, constants, error codes and result shapes, so the adapter
cannot tell it from the real module. It deliberately reproduces the behaviours detection must cope
with:

- calls before ``nvmlInit`` raise ``UNINITIALIZED``; init and shutdown are reference counted;
- ``init_error`` makes ``nvmlInit`` fail; no NVIDIA host at all is ``LIBRARY_NOT_FOUND``;
- a card's ``faults`` (NVML function name → error name) make that call fail for that card, and
  ``nvmlDeviceGetMemoryInfo_v2`` names the v2 form alone;
- once a card answers ``GPU_IS_LOST`` it answers nothing else, as a card off the bus does;
- usage moves when the profile has a ``load`` pattern and the simulator a clock
  (:mod:`~agent.devices.simulation.load`): utilization, memory used, temperature and power are
  then the pattern's at ``clock()``; without either they are the profile's snapshot;
- utilization is ``NOT_SUPPORTED`` on a MIG-enabled card, as on real hardware; GPM
  (:mod:`~agent.devices.simulation.fakegpm`) gives Hopper cards and their GPU instances
  activity figures from two samples;
- XID events: a card's profile ``xids`` and :meth:`SimulatedNvml.inject_xid` feed the event-set
  calls (``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``, ``nvmlEventSetWait``,
  ``nvmlEventSetFree``); :meth:`SimulatedNvml.lose` makes a card fall off the bus, which a
  waiting event set reports once as ``GPU_IS_LOST``. The wait blocks the calling thread (as the
  real one does) and wakes as soon as an XID is injected from another thread.

- MIG management with real placement accounting: GPU instances occupy the memory slices of a
  legal placement of their profile; an overlapping placement, a profile past its
  ``instanceCount`` or a card out of compute slices answers ``INSUFFICIENT_RESOURCES``; a card
  with MIG off answers ``NOT_SUPPORTED``; a GI with compute instances inside, or a CI marked busy
  (:meth:`SimulatedNvml.make_busy`), refuses destruction with ``IN_USE``; every compute instance
  is a MIG device with its own ``MIG-`` UUID, found through the card's MIG device slots. GI and
  CI handles are opaque integers (held in ``c_nvmlGpuInstance_t`` arrays like real handles); a
  destroyed one answers ``INVALID_ARGUMENT``. :meth:`SimulatedNvml.instances` shows the state.

:func:`opened` lists the simulated NVMLs alive in this process, so an in-process demo or test
(``standalone --simulate``, the dashboard's browser test) can make a running agent's card fail.

Every call is logged as ``(function, card index or None)`` in :attr:`SimulatedNvml.calls`.
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import SimpleNamespace

from agent.devices.simulation.fakegpm import GpmCalls
from agent.devices.simulation.fakemig import (
    MigCalls,
    SimulatedGpuInstance,
    SimulatedHandle,
    SimulatedMigHandle,
)
from agent.devices.simulation.faketelemetry import TelemetryCalls
from agent.devices.simulation.load import Reading, reading
from agent.devices.simulation.nvmlerrors import *
from agent.devices.simulation.nvmlerrors import ERROR_CODES, NVMLError
from agent.devices.simulation.profiles import NvidiaCard, NvidiaHost
from agent.errors import ProfileError


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass
class SimulatedEventSet:
    """An event set: the cards registered on it, and the lost cards it already reported."""

    indexes: set[int]
    reported_lost: set[int]
    freed: bool = False


def _cpu_set(text: str | None) -> set[int]:
    numbers: set[int] = set()
    for part in (text or "").split(","):
        if not part.strip():
            continue
        low, _, high = part.partition("-")
        numbers.update(range(int(low), int(high or low) + 1))
    return numbers


def _words(numbers: Iterable[int], count: int) -> list[int]:
    words = [0] * count
    for n in numbers:
        if n < count * 64:
            words[n // 64] |= 1 << (n % 64)
    return words


_OPENED: weakref.WeakSet[SimulatedNvml] = weakref.WeakSet()


def opened() -> list[SimulatedNvml]:
    """The simulated NVMLs alive in this process (weakly held: a closed agent's goes away)."""
    return list(_OPENED)


class SimulatedNvml(MigCalls, TelemetryCalls, GpmCalls):
    """The pynvml module, simulated from a profile's ``nvidia`` section (None: no driver)."""

    NVMLError = NVMLError
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t
    nvmlMemory_v2 = 0x02000028
    NVML_TEMPERATURE_GPU = 0
    NVML_AFFINITY_SCOPE_NODE = 0
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    c_nvmlGpuInstance_t = ctypes.c_size_t
    c_nvmlComputeInstance_t = ctypes.c_size_t
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    nvmlEventTypeXidCriticalError = 0x0000000000000008

    def __init__(
        self,
        host: NvidiaHost | None,
        *,
        system_faults: dict[str, str] | None = None,
        clock: Callable[[], float] | None = None,
    ):
        """``clock`` (seconds, e.g. ``time.time``) makes a profile's ``load`` pattern move."""
        self.host = host
        self.clock = clock
        self.cards: tuple[NvidiaCard, ...] = host.cards if host else ()
        self.system_faults = dict(system_faults or {})
        self.calls: list[tuple[str, int | None]] = []
        self.refcount = 0
        self._reads: dict[tuple[str, int], int] = {}
        """How often each simulated counter was read, per card (see faketelemetry)."""
        self.lost: set[int] = set()
        self._xids: dict[int, list[int]] = {i: list(c.xids) for i, c in enumerate(self.cards)}
        self._events = threading.Condition()
        """Guards ``_xids`` and ``lost`` for waits in worker threads; notified on every change."""
        self._mig = threading.RLock()
        """Guards the MIG state and the init count: allocation and detection call from threads."""
        self._gis: dict[int, dict[int, SimulatedGpuInstance]] = {}
        self._handles: dict[int, tuple[int, int, int | None]] = {}
        """Opaque GI/CI handle -> (card index, GI id, CI id or None for a GI)."""
        self._next_handle = 1
        self._created = 0
        self._gpm_buffers = {}
        self._gpm_sources = {}
        self._gpm_next = 1
        for where, faults in [("system", self.system_faults)] + [
            (f"card {i}", c.faults) for i, c in enumerate(self.cards)
        ]:
            unknown = sorted(set(faults.values()) - set(ERROR_CODES))
            if unknown:
                raise ProfileError(f"nvidia {where}: unknown NVML error names {unknown}")
        if host and host.init_error and host.init_error not in ERROR_CODES:
            raise ProfileError(f"nvidia initError: unknown NVML error name {host.init_error!r}")
        _OPENED.add(self)

    # -- health-loop hooks --------------------------------------------------------------------

    def inject_xid(self, index: int, xid: int) -> None:
        """Queue an XID for card ``index``; a thread waiting on an event set wakes at once."""
        with self._events:
            self._xids.setdefault(index, []).append(xid)
            self._events.notify_all()

    def pending_xids(self, index: int) -> list[int]:
        """XIDs not yet consumed for card ``index``; reading them consumes them."""
        with self._events:
            pending = self._xids.get(index, [])
            self._xids[index] = []
            return pending

    def lose(self, index: int) -> None:
        """Make card ``index`` fall off the bus: every later call on it answers GPU_IS_LOST."""
        with self._events:
            self.lost.add(index)
            self._events.notify_all()

    # -- plumbing -----------------------------------------------------------------------------

    def _system(self, fn: str) -> None:
        self.calls.append((fn, None))
        if self.refcount == 0:
            raise NVMLError(UNINITIALIZED)
        if fn in self.system_faults:
            raise NVMLError(ERROR_CODES[self.system_faults[fn]])

    def _card(
        self, fn: str, handle: SimulatedHandle | SimulatedMigHandle | int, *aliases: str
    ) -> NvidiaCard:
        """Log the call, then fail it the way the card's state and faults say."""
        index = handle if isinstance(handle, int) else handle.index
        self.calls.append((fn, index))
        if self.refcount == 0:
            raise NVMLError(UNINITIALIZED)
        if not 0 <= index < len(self.cards):
            raise NVMLError(ERROR_CODES["INVALID_ARGUMENT"])
        if index in self.lost:
            raise NVMLError(GPU_IS_LOST)
        card = self.cards[index]
        for name in (fn, *aliases):
            fault = card.faults.get(name)
            if fault is not None:
                if fault == "GPU_IS_LOST":
                    self.lost.add(index)
                raise NVMLError(ERROR_CODES[fault])
        return card

    # -- lifecycle ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append(("nvmlInit", None))
        if self.host is None:
            raise NVMLError(ERROR_CODES["LIBRARY_NOT_FOUND"])
        if self.host.init_error:
            raise NVMLError(ERROR_CODES[self.host.init_error])
        with self._mig:
            self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._system("nvmlShutdown")
        with self._mig:
            self.refcount -= 1

    # -- system -------------------------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        self._system("nvmlSystemGetDriverVersion")
        assert self.host is not None
        return self.host.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._system("nvmlSystemGetCudaDriverVersion")
        assert self.host is not None
        return self.host.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._system("nvmlDeviceGetCount")
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimulatedHandle:
        self._card("nvmlDeviceGetHandleByIndex", index)
        return SimulatedHandle(index)

    # -- identity -----------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: SimulatedHandle | SimulatedMigHandle) -> str:
        card = self._card("nvmlDeviceGetUUID", handle)
        if isinstance(handle, SimulatedMigHandle):
            return self._mig_ci(handle).uuid
        return card.uuid

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes | str) -> SimulatedHandle:
        self._system("nvmlDeviceGetHandleByUUID")
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, card in enumerate(self.cards):
            if card.uuid == wanted:
                self._card("nvmlDeviceGetHandleByUUID", index)
                return SimulatedHandle(index)
        raise NVMLError(NOT_FOUND)

    def nvmlDeviceGetName(self, handle: SimulatedHandle) -> str:
        return self._card("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMinorNumber(self, handle: SimulatedHandle) -> int:
        card = self._card("nvmlDeviceGetMinorNumber", handle)
        if card.minor is None:
            raise NVMLError(NOT_SUPPORTED)
        return card.minor

    def nvmlDeviceGetPciInfo(self, handle: SimulatedHandle) -> SimpleNamespace:
        card = self._card("nvmlDeviceGetPciInfo", handle)
        domain, _, rest = card.bus_id.partition(":")
        return SimpleNamespace(
            busIdLegacy=card.bus_id.upper().encode(),
            busId=f"{int(domain, 16):08X}:{rest.upper()}".encode(),
            pciDeviceId=(card.device_id << 16) | 0x10DE,
        )

    # -- capability ---------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(
        self, handle: SimulatedHandle, version: int | None = None
    ) -> SimpleNamespace:
        aliases = ("nvmlDeviceGetMemoryInfo_v2",) if version else ()
        card = self._card("nvmlDeviceGetMemoryInfo", handle, *aliases)
        total = card.memory_total_mib << 20
        reserved = card.memory_reserved_mib << 20
        used = self._now(card).memory_used_mib << 20
        if isinstance(handle, SimulatedMigHandle):  # what the MIG device sees: its GI's share
            with self._mig:
                self._mig_ci(handle)
                gi = self._gis[handle.index][handle.gpu_instance_id]
            share = gi.profile.memory_mib / card.memory_total_mib
            total, reserved, used = gi.profile.memory_mib << 20, 0, int(used * share) >> 20 << 20
        if not version:  # v1: "used" includes what the driver reserved
            return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
        return SimpleNamespace(
            version=version, total=total, reserved=reserved, used=used,
            free=total - reserved - used,
        )  # fmt: skip

    def nvmlDeviceGetNumGpuCores(self, device: SimulatedHandle) -> int:
        card = self._card("nvmlDeviceGetNumGpuCores", device)
        if card.cuda_cores is None:
            raise NVMLError(NOT_SUPPORTED)
        return card.cuda_cores

    def nvmlDeviceGetCudaComputeCapability(self, handle: SimulatedHandle) -> tuple[int, int]:
        return self._card("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetArchitecture(self, device: SimulatedHandle) -> int:
        card = self._card("nvmlDeviceGetArchitecture", device)
        if card.architecture is None:
            raise NVMLError(NOT_SUPPORTED)
        return card.architecture

    def nvmlDeviceGetCpuAffinity(self, handle: SimulatedHandle, cpuSetSize: int) -> list[int]:
        card = self._card("nvmlDeviceGetCpuAffinity", handle)
        return _words(_cpu_set(card.cpu_list), cpuSetSize)

    def nvmlDeviceGetMemoryAffinity(
        self,
        handle: SimulatedHandle,
        nodeSetSize: int,
        scope: int,
    ) -> list[int]:
        card = self._card("nvmlDeviceGetMemoryAffinity", handle)
        nodes = () if card.numa_node is None else (card.numa_node,)
        return _words(nodes, nodeSetSize)

    # -- usage --------------------------------------------------------------------------------

    def _now(self, card: NvidiaCard) -> Reading:
        """The card's usage now: the load pattern's at the clock, else the profile's snapshot."""
        pattern = self.host.load if self.host else None
        if pattern is None or self.clock is None:
            return Reading(
                utilization_percent=card.utilization_percent or 0,
                memory_used_mib=card.memory_used_mib,
                temperature_c=card.temperature_c,
                power_mw=card.power_mw,
            )
        return reading(
            pattern, card.uuid, self.clock(),
            level_percent=card.utilization_percent or 0,
            memory_mib=card.memory_total_mib - card.memory_reserved_mib,
            temperature=card.temperature_c is not None, power=card.power_mw is not None,
        )  # fmt: skip

    def nvmlDeviceGetUtilizationRates(self, handle: SimulatedHandle) -> SimpleNamespace:
        card = self._card("nvmlDeviceGetUtilizationRates", handle)
        if card.utilization_percent is None or card.mig_mode:
            raise NVMLError(NOT_SUPPORTED)
        gpu = self._now(card).utilization_percent
        return SimpleNamespace(gpu=gpu, memory=card.memory_copy_percent or 0)

    def nvmlDeviceGetTemperature(self, handle: SimulatedHandle, sensor: int) -> int:
        card = self._card("nvmlDeviceGetTemperature", handle)
        temperature = self._now(card).temperature_c
        if temperature is None or sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError(NOT_SUPPORTED)
        return temperature

    def nvmlDeviceGetPowerUsage(self, handle: SimulatedHandle) -> int:
        card = self._card("nvmlDeviceGetPowerUsage", handle)
        power = self._now(card).power_mw
        if power is None:
            raise NVMLError(NOT_SUPPORTED)
        return power

    # -- events -------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> SimulatedEventSet:
        self._system("nvmlEventSetCreate")
        return SimulatedEventSet(indexes=set(), reported_lost=set())

    def nvmlDeviceRegisterEvents(
        self, handle: SimulatedHandle, eventTypes: int, eventSet: SimulatedEventSet
    ) -> None:
        self._card("nvmlDeviceRegisterEvents", handle)
        if eventTypes & ~self.nvmlEventTypeXidCriticalError:
            raise NVMLError(NOT_SUPPORTED)  # only XID events are simulated
        with self._events:
            eventSet.indexes.add(handle.index)

    def nvmlEventSetWait(self, eventSet: SimulatedEventSet, timeoutms: int) -> SimpleNamespace:
        """The next XID of a registered card, oldest first; TIMEOUT when none came in time."""
        self._system("nvmlEventSetWait")
        deadline = time.monotonic() + timeoutms / 1000
        with self._events:
            while True:
                if eventSet.freed:
                    raise NVMLError(ERROR_CODES["INVALID_ARGUMENT"])
                event = self._next_event(eventSet)
                if event is not None:
                    return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NVMLError(TIMEOUT)
                self._events.wait(remaining)

    def _next_event(self, eventSet: SimulatedEventSet) -> SimpleNamespace | None:
        """Called with ``_events`` held: a newly lost card raises, else the next XID or None."""
        for index in sorted(eventSet.indexes):
            if index in self.lost and index not in eventSet.reported_lost:
                eventSet.reported_lost.add(index)
                raise NVMLError(GPU_IS_LOST)
            pending = self._xids.get(index)
            if pending and index not in self.lost:
                return SimpleNamespace(
                    device=SimulatedHandle(index),
                    eventType=self.nvmlEventTypeXidCriticalError,
                    eventData=pending.pop(0),
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        return None

    def nvmlEventSetFree(self, eventSet: SimulatedEventSet) -> None:
        self._system("nvmlEventSetFree")
        with self._events:
            eventSet.freed = True
            self._events.notify_all()

"""A pynvml-compatible NVML built from a profile, so the NVIDIA backend runs without a GPU.

:class:`SimulatedNvml` offers the subset of nvidia-ml-py that :mod:`agent.devices.nvml` uses, with
the same function names, signatures, constants, error codes and result shapes, so the adapter
cannot tell it from the real module. It deliberately reproduces the behaviours detection must cope
with:

- calls before ``nvmlInit`` raise ``UNINITIALIZED``; init and shutdown are reference counted;
- ``init_error`` makes ``nvmlInit`` fail; no NVIDIA host at all is ``LIBRARY_NOT_FOUND``;
- a card's ``faults`` (NVML function name → error name) make that call fail for that card, and
  ``nvmlDeviceGetMemoryInfo_v2`` names the v2 form alone;
- once a card answers ``GPU_IS_LOST`` it answers nothing else, as a card off the bus does;
- utilization is ``NOT_SUPPORTED`` on a MIG-enabled card, as on real hardware;
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

Every call is logged as ``(function, card index or None)`` in :attr:`SimulatedNvml.calls`.
"""

from __future__ import annotations

import ctypes
import threading
import time
import uuid as uuid_module
from collections.abc import Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from agent.devices.simulation.profiles import MigProfile, NvidiaCard, NvidiaHost
from agent.errors import ProfileError

ERROR_CODES: dict[str, int] = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "IN_USE": 19,
    "INSUFFICIENT_RESOURCES": 23,
    "UNKNOWN": 999,
}

_MESSAGES = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    19: "Resource in use",
    23: "Insufficient resources",
    999: "Unknown Error",
}

UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NOT_FOUND = 6
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
TIMEOUT = 10
GPU_IS_LOST = 15


class NVMLError(Exception):
    """Shaped like pynvml's: an int ``.value`` and NVML's message as ``str()``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass(frozen=True)
class SimulatedHandle:
    index: int


@dataclass(frozen=True)
class SimulatedMigHandle:
    """A MIG device handle: the parent card's ``index`` plus the instance ids."""

    index: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass
class SimulatedComputeInstance:
    id: int
    profile_id: int
    slice_count: int
    uuid: str
    busy: int = 0
    """How many more destroy attempts answer IN_USE (a process still running)."""


@dataclass
class SimulatedGpuInstance:
    id: int
    profile: MigProfile
    start: int
    size: int
    compute: dict[int, SimulatedComputeInstance]


# CI profile index -> compute slices (NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7,8,6}_SLICE).
_CI_SLICES: dict[int, int] = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}


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


class SimulatedNvml:
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

    def __init__(self, host: NvidiaHost | None, *, system_faults: dict[str, str] | None = None):
        self.host = host
        self.cards: tuple[NvidiaCard, ...] = host.cards if host else ()
        self.system_faults = dict(system_faults or {})
        self.calls: list[tuple[str, int | None]] = []
        self.refcount = 0
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
        for where, faults in [("system", self.system_faults)] + [
            (f"card {i}", c.faults) for i, c in enumerate(self.cards)
        ]:
            unknown = sorted(set(faults.values()) - set(ERROR_CODES))
            if unknown:
                raise ProfileError(f"nvidia {where}: unknown NVML error names {unknown}")
        if host and host.init_error and host.init_error not in ERROR_CODES:
            raise ProfileError(f"nvidia initError: unknown NVML error name {host.init_error!r}")

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
        used = card.memory_used_mib << 20
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

    def nvmlDeviceGetMigMode(self, device: SimulatedHandle) -> list[int]:
        card = self._card("nvmlDeviceGetMigMode", device)
        if not card.mig_profiles and not card.mig_mode:
            raise NVMLError(NOT_SUPPORTED)  # not a MIG-capable part
        mode = int(card.mig_mode)
        return [mode, mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: SimulatedHandle, profile: int, version: int = 2
    ) -> SimpleNamespace:
        card = self._card("nvmlDeviceGetGpuInstanceProfileInfo", device)
        found = self._mig_profile(card, profile)
        return SimpleNamespace(
            id=found.id,
            sliceCount=found.slice_count,
            instanceCount=found.instance_count,
            multiprocessorCount=found.multiprocessor_count,
            memorySizeMB=found.memory_mib,
            name=f"MIG {found.name}".encode(),
        )

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self,
        device: SimulatedHandle,
        profileId: int,
        placementsRef: Any,
        countRef: Any,
    ) -> int:
        card = self._card("nvmlDeviceGetGpuInstancePossiblePlacements", device)
        found = self._mig_profile(card, profileId)
        if placementsRef is None:
            countRef.contents.value = len(found.placement_starts)
            return 0
        if countRef.contents.value < len(found.placement_starts):
            raise NVMLError(7)  # INSUFFICIENT_SIZE
        for i, start in enumerate(found.placement_starts):
            placementsRef[i].start = start
            placementsRef[i].size = found.placement_size
        countRef.contents.value = len(found.placement_starts)
        return 0

    @staticmethod
    def _mig_profile(card: NvidiaCard, profile: int) -> MigProfile:
        # Real NVML answers NOT_SUPPORTED with MIG off or for a profile the part lacks.
        for candidate in card.mig_profiles if card.mig_mode else ():
            if candidate.id == profile:
                return candidate
        raise NVMLError(NOT_SUPPORTED)

    # -- MIG management -----------------------------------------------------------------------

    def make_busy(self, mig_uuid: str, attempts: int) -> None:
        """The next ``attempts`` destroys of this MIG device's CI answer IN_USE."""
        with self._mig:
            for gis in self._gis.values():
                for gi in gis.values():
                    for ci in gi.compute.values():
                        if ci.uuid == mig_uuid:
                            ci.busy = attempts
                            return
        raise KeyError(mig_uuid)

    def instances(self, index: int) -> list[tuple[str, int, int, tuple[str, ...]]]:
        """Card ``index``'s GIs as ``(profile name, start, size, MIG UUIDs)``, by start."""
        with self._mig:
            gis = sorted(self._gis.get(index, {}).values(), key=lambda g: g.start)
            return [
                (g.profile.name, g.start, g.size, tuple(c.uuid for c in g.compute.values()))
                for g in gis
            ]

    def _new_handle(self, target: tuple[int, int, int | None]) -> int:
        """The handle of ``target``: the same one each time (as NVML's are), until destroyed."""
        for handle, known in self._handles.items():
            if known == target:
                return handle
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = target
        return handle

    def _gi(self, fn: str, handle: int) -> SimulatedGpuInstance:
        target = self._handles.get(int(handle))
        if target is None or target[2] is not None:
            self.calls.append((fn, None))
            raise NVMLError(INVALID_ARGUMENT)
        self._card(fn, target[0])
        return self._gis[target[0]][target[1]]

    def _ci(self, fn: str, handle: int) -> tuple[SimulatedGpuInstance, SimulatedComputeInstance]:
        target = self._handles.get(int(handle))
        if target is None or target[2] is None:
            self.calls.append((fn, None))
            raise NVMLError(INVALID_ARGUMENT)
        self._card(fn, target[0])
        gi = self._gis[target[0]][target[1]]
        return gi, gi.compute[target[2]]

    def _mig_ci(self, handle: SimulatedMigHandle) -> SimulatedComputeInstance:
        gi = self._gis.get(handle.index, {}).get(handle.gpu_instance_id)
        ci = gi.compute.get(handle.compute_instance_id) if gi else None
        if ci is None:
            raise NVMLError(INVALID_ARGUMENT)  # the instance was destroyed under the handle
        return ci

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: SimulatedHandle, profileId: int, placement: Any
    ) -> int:
        with self._mig:
            card = self._card("nvmlDeviceCreateGpuInstanceWithPlacement", device)
            profile = self._mig_profile(card, profileId)
            where = getattr(placement, "contents", placement)
            start, size = int(where.start), int(where.size)
            if start not in profile.placement_starts or size != profile.placement_size:
                raise NVMLError(INVALID_ARGUMENT)
            gis = self._gis.setdefault(device.index, {})
            taken = {s for g in gis.values() for s in range(g.start, g.start + g.size)}
            compute = sum(g.profile.slice_count for g in gis.values())
            same = sum(1 for g in gis.values() if g.profile.id == profile.id)
            total = max(p.slice_count for p in card.mig_profiles)
            if (
                taken & set(range(start, start + size))
                or same >= profile.instance_count
                or compute + profile.slice_count > total
            ):
                raise NVMLError(INSUFFICIENT_RESOURCES)
            gi_id = next(i for i in range(1, 64) if i not in gis)
            gis[gi_id] = SimulatedGpuInstance(gi_id, profile, start, size, {})
            return self._new_handle((device.index, gi_id, None))

    def nvmlDeviceGetGpuInstances(
        self, device: SimulatedHandle, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        with self._mig:
            card = self._card("nvmlDeviceGetGpuInstances", device)
            profile = self._mig_profile(card, profileId)
            found = [
                g for g in self._gis.get(device.index, {}).values() if g.profile.id == profile.id
            ]
            if len(gpuInstancesRef) < len(found):
                raise NVMLError(7)  # INSUFFICIENT_SIZE
            for i, gi in enumerate(sorted(found, key=lambda g: g.id)):
                gpuInstancesRef[i] = self._new_handle((device.index, gi.id, None))
            countRef.contents.value = len(found)
            return 0

    def nvmlGpuInstanceGetInfo(self, gpuInstance: int) -> SimpleNamespace:
        with self._mig:
            gi = self._gi("nvmlGpuInstanceGetInfo", gpuInstance)
            placement = SimpleNamespace(start=gi.start, size=gi.size)
            return SimpleNamespace(id=gi.id, profileId=gi.profile.id, placement=placement)

    def nvmlGpuInstanceDestroy(self, gpuInstance: int) -> int:
        with self._mig:
            gi = self._gi("nvmlGpuInstanceDestroy", gpuInstance)
            if gi.compute:
                raise NVMLError(IN_USE)
            index = self._handles[int(gpuInstance)][0]
            del self._gis[index][gi.id]
            self._forget(index, gi.id)
            return 0

    def _forget(self, index: int, gi_id: int, ci_id: int | None = None) -> None:
        """Invalidate every handle of a destroyed GI (``ci_id`` None) or CI."""
        for handle, (i, g, c) in list(self._handles.items()):
            if i == index and g == gi_id and (ci_id is None or c == ci_id):
                del self._handles[handle]

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: int, profile: int, engProfile: int, version: int = 2
    ) -> SimpleNamespace:
        with self._mig:
            gi = self._gi("nvmlGpuInstanceGetComputeInstanceProfileInfo", device)
            slices = _CI_SLICES.get(profile)
            if slices is None or slices > gi.profile.slice_count or engProfile != 0:
                raise NVMLError(NOT_SUPPORTED)
            sms = gi.profile.multiprocessor_count * slices // gi.profile.slice_count
            return SimpleNamespace(
                id=profile,
                sliceCount=slices,
                instanceCount=gi.profile.slice_count // slices,
                multiprocessorCount=sms,
                name=f"MIG {slices}c.{gi.profile.name}".encode(),
            )

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: int, profileId: int) -> int:
        with self._mig:
            gi = self._gi("nvmlGpuInstanceCreateComputeInstance", gpuInstance)
            slices = _CI_SLICES.get(profileId)
            if slices is None or slices > gi.profile.slice_count:
                raise NVMLError(NOT_SUPPORTED)
            if sum(c.slice_count for c in gi.compute.values()) + slices > gi.profile.slice_count:
                raise NVMLError(INSUFFICIENT_RESOURCES)
            index = self._handles[int(gpuInstance)][0]
            ci_id = next(i for i in range(8) if i not in gi.compute)
            self._created += 1
            seed = f"{self.cards[index].uuid}/{gi.id}/{ci_id}/{self._created}"
            mig_uuid = f"MIG-{uuid_module.uuid5(uuid_module.NAMESPACE_OID, seed)}"
            gi.compute[ci_id] = SimulatedComputeInstance(ci_id, profileId, slices, mig_uuid)
            return self._new_handle((index, gi.id, ci_id))

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: int, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        with self._mig:
            gi = self._gi("nvmlGpuInstanceGetComputeInstances", gpuInstance)
            if _CI_SLICES.get(profileId, 99) > gi.profile.slice_count:
                raise NVMLError(NOT_SUPPORTED)
            index = self._handles[int(gpuInstance)][0]
            found = sorted(c.id for c in gi.compute.values() if c.profile_id == profileId)
            if len(computeInstancesRef) < len(found):
                raise NVMLError(7)  # INSUFFICIENT_SIZE
            for i, ci_id in enumerate(found):
                computeInstancesRef[i] = self._new_handle((index, gi.id, ci_id))
            countRef.contents.value = len(found)
            return 0

    def nvmlComputeInstanceGetInfo(self, computeInstance: int) -> SimpleNamespace:
        with self._mig:
            _gi, ci = self._ci("nvmlComputeInstanceGetInfo", computeInstance)
            return SimpleNamespace(id=ci.id, profileId=ci.profile_id)

    def nvmlComputeInstanceDestroy(self, computeInstance: int) -> int:
        with self._mig:
            gi, ci = self._ci("nvmlComputeInstanceDestroy", computeInstance)
            if ci.busy > 0:
                ci.busy -= 1
                raise NVMLError(IN_USE)
            index = self._handles[int(computeInstance)][0]
            del gi.compute[ci.id]
            self._forget(index, gi.id, ci.id)
            return 0

    def nvmlDeviceGetMaxMigDeviceCount(self, device: SimulatedHandle) -> int:
        card = self._card("nvmlDeviceGetMaxMigDeviceCount", device)
        if not card.mig_mode or not card.mig_profiles:
            raise NVMLError(NOT_SUPPORTED)
        return max(p.instance_count for p in card.mig_profiles)

    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, device: SimulatedHandle, index: int
    ) -> SimulatedMigHandle:
        with self._mig:
            self._card("nvmlDeviceGetMigDeviceHandleByIndex", device)
            slots = [
                (gi.id, ci.id)
                for gi in sorted(self._gis.get(device.index, {}).values(), key=lambda g: g.id)
                for ci in sorted(gi.compute.values(), key=lambda c: c.id)
            ]
            if not 0 <= index < len(slots):
                raise NVMLError(NOT_FOUND)
            return SimulatedMigHandle(device.index, *slots[index])

    def nvmlDeviceGetGpuInstanceId(self, device: SimulatedMigHandle) -> int:
        self._card("nvmlDeviceGetGpuInstanceId", device)
        if not isinstance(device, SimulatedMigHandle):
            raise NVMLError(INVALID_ARGUMENT)
        return device.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: SimulatedMigHandle) -> int:
        self._card("nvmlDeviceGetComputeInstanceId", device)
        if not isinstance(device, SimulatedMigHandle):
            raise NVMLError(INVALID_ARGUMENT)
        return device.compute_instance_id

    # -- locality -----------------------------------------------------------------------------

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

    def nvmlDeviceGetUtilizationRates(self, handle: SimulatedHandle) -> SimpleNamespace:
        card = self._card("nvmlDeviceGetUtilizationRates", handle)
        if card.utilization_percent is None or card.mig_mode:
            raise NVMLError(NOT_SUPPORTED)
        return SimpleNamespace(gpu=card.utilization_percent, memory=0)

    def nvmlDeviceGetTemperature(self, handle: SimulatedHandle, sensor: int) -> int:
        card = self._card("nvmlDeviceGetTemperature", handle)
        if card.temperature_c is None or sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError(NOT_SUPPORTED)
        return card.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: SimulatedHandle) -> int:
        card = self._card("nvmlDeviceGetPowerUsage", handle)
        if card.power_mw is None:
            raise NVMLError(NOT_SUPPORTED)
        return card.power_mw

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

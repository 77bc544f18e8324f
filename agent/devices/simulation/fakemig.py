"""MIG in the simulated NVML: GPU and compute instances with real placement accounting.

A mixin of :class:`~agent.devices.simulation.fakenvml.SimulatedNvml`: it refuses what NVML
refuses (overlapping memory slices, a profile past its count, a card out of compute slices or
with MIG off, destroying a GPU instance that still has compute instances or a busy one), and
gives every compute instance a ``MIG-`` UUID. State is guarded by the host's ``_mig`` lock,
because allocation and detection call from worker threads.
"""

from __future__ import annotations

import threading
import uuid as uuid_module
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from agent.devices.simulation.nvmlerrors import *
from agent.devices.simulation.nvmlerrors import NVMLError
from agent.devices.simulation.profiles import MigProfile, NvidiaCard


@dataclass(frozen=True)
class SimulatedHandle:
    """A card handle: the card's index."""

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


class MigCalls:
    """The MIG part of the simulated pynvml module (see the module docstring)."""

    cards: tuple[NvidiaCard, ...]
    calls: list[tuple[str, int | None]]
    _mig: threading.RLock
    _gis: dict[int, dict[int, SimulatedGpuInstance]]
    _handles: dict[int, tuple[int, int, int | None]]
    _next_handle: int
    _created: int

    def _card(self, fn: str, handle: Any, *aliases: str) -> NvidiaCard:
        raise NotImplementedError  # provided by SimulatedNvml

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

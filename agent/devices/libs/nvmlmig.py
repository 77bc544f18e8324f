"""The NVML adapter's MIG part: a card's GPU-instance profiles and placements, and the GPU
instances, compute instances and MIG devices that are created, listed and destroyed on it.

:class:`MigCalls` is a base of :class:`agent.devices.libs.nvml.Nvml`, where callers find these
methods; it calls the binding through :class:`agent.devices.libs.nvmlcalls.Binding` and imports no
``pynvml``. A MIG device is named by its ``MIG-`` UUID, found by walking the card's MIG device
slots (:meth:`MigCalls.mig_devices`) and matching the GI and CI ids, because slot numbers shift
when a sibling is destroyed. Creating and destroying needs root on real hardware
(:class:`~agent.devices.libs.nvmlcalls.NvmlNotPermitted` otherwise).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from agent.devices.libs.nvmlcalls import (
    ABSENT,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    PROFILE_ABSENT_CODES,
    Binding,
    Handle,
    NvmlCallFailed,
    text,
)

__all__ = ["ComputeInstance", "GpuInstance", "GpuInstanceProfile", "MigCalls", "MigDevice"]


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


class MigCalls(Binding):
    """MIG profiles, placements and instances of a card (see the module docstring)."""

    def mig_mode(self, h: Handle) -> bool:
        """The *current* MIG mode (a pending change takes effect only after a reset).

        A card that is not MIG-capable answers NOT_SUPPORTED: that is "off", not a failure.
        """
        got = self._call_unless(frozenset({NOT_SUPPORTED}), "nvmlDeviceGetMigMode", h)
        if got is ABSENT:
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
            name = text(info.name).removeprefix("MIG ").strip()
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
        info = self._call_unless(PROFILE_ABSENT_CODES, name, h, index)
        return None if info is ABSENT else info

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

    # -- management (needs root on real hardware) ---------------------------------------------

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
            info = self._call_unless(PROFILE_ABSENT_CODES, name, gi, index, shared)
            if info is ABSENT:
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
            if self._call_unless(PROFILE_ABSENT_CODES, name, *args) is ABSENT:
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
            if mig is ABSENT:
                continue  # an empty slot
            found.append(
                MigDevice(
                    uuid=text(self._call("nvmlDeviceGetUUID", mig)),
                    gpu_instance_id=int(self._call("nvmlDeviceGetGpuInstanceId", mig)),
                    compute_instance_id=int(self._call("nvmlDeviceGetComputeInstanceId", mig)),
                    handle=mig,
                )
            )
        return tuple(found)

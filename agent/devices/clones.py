"""The reader shared by the two NVML clones: Iluvatar (IXML) and T-Head (HGML).

Both enumerate, identify and measure cards exactly as NVML does, in NVML's units (bytes → MiB
truncated, mW → W truncated). What differs is passed in: the device-node number
(Iluvatar's ``/dev/iluvatar<minor>``, T-Head's ``/dev/alixpu_ppu<ordinal>``) and whether the card
can be partitioned (HGML's MIG). ``cores`` is the library's GPU-core count as reported (these
clones publish no cores-per-SM table to derive multiprocessors from).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from agent.devices.hostfs import HostFS
from agent.devices.libs import clib, nvmlabi
from agent.devices.vendor import Card, Get, Usage
from bus import devices


class CloneReader:
    """:class:`agent.devices.vendor.Reader` over an NVML-shaped library; a slot is an index."""

    def __init__(
        self,
        manufacturer: str,
        library: str,
        abi: nvmlabi.NvmlAbi,
        host: HostFS,
        *,
        node_number: Callable[[int, int | None], int | None],
        partitions: bool = False,
    ) -> None:
        self.manufacturer = manufacturer
        self.library = library
        self.abi = abi
        self.host = host
        self.node_number = node_number
        """``(index, minor) → the /dev node number`` (None: unknown)."""
        self.partitions = partitions

    @contextmanager
    def session(self) -> Iterator[object]:
        """Init for the pass, shutdown after it (init is reference counted, as NVML's is)."""
        self.abi.init()
        try:
            yield self
        finally:
            with suppress(clib.LibError):
                self.abi.shutdown()

    def versions(self) -> tuple[str | None, str | None]:
        driver = runtime = None
        with suppress(clib.LibUnsupported):
            driver = self.abi.driver_version() or None
        with suppress(clib.LibUnsupported):
            value = self.abi.runtime_version()
            runtime = clib.cuda_style_version(value) if value > 0 else None
        return driver, runtime

    def slots(self) -> range:
        return range(self.abi.device_count())

    def identify(self, slot: int) -> tuple[Any, str]:
        handle = self.abi.handle(slot)
        return (slot, handle), self.abi.uuid(handle)

    def describe(self, handle: tuple[int, Any], card: Card, get: Get) -> None:
        index, h = handle
        card.bus_id = get(self.abi.pci_bus_id, h)
        number = self.node_number(index, get(self.abi.minor_number, h))
        card.physical_indexes = (number,) if number is not None else None
        card.name = get(self.abi.name, h) or None
        memory = get(self.abi.memory, h)
        card.memory_mib = memory[0] >> 20 if memory else None
        card.cores = get(self.abi.num_cores, h) or None
        capability = get(self.abi.compute_capability, h)
        card.compute_capability = f"{capability[0]}.{capability[1]}" if capability else None
        if self.partitions and get(self.abi.mig_mode, h):
            profiles = get(self.abi.gpu_instance_profiles, h)
            card.physical_sliced = _physical(profiles or [])

    def measure(self, handle: tuple[int, Any], get: Get) -> Usage:
        _, h = handle
        memory = get(self.abi.memory, h)
        power = get(self.abi.power_usage, h)
        return Usage(
            memory_mib=memory[0] >> 20 if memory else None,
            memory_used_mib=memory[1] >> 20 if memory else None,
            cores_utilization=get(self.abi.utilization, h),
            temperature=get(self.abi.temperature, h),
            power_w=power // 1000 if power is not None else None,
        )

    def release(self, handle: Any) -> None:
        pass


def _physical(
    profiles: list[tuple[nvmlabi.GpuInstanceProfileInfo, int, int]],
) -> devices.PhysicalSliced:
    """Partition profiles a pod can ask for: named ``<slices>g.<GiB>gb``, with a placement."""
    offered = tuple(
        devices.SliceProfile(
            name=f"{info.sliceCount}g.{info.memorySizeMB >> 10}gb",
            memory_mib=int(info.memorySizeMB),
            compute_slices=int(info.sliceCount),
            memory_slices=size,
            count=int(info.instanceCount),
        )
        for info, size, placements in profiles
        if placements > 0 and info.instanceCount > 0
    )
    return devices.PhysicalSliced(
        profiles=offered, count=max((p.count for p in offered), default=0)
    )

"""The wire shapes of a node's accelerators: the ``Devices`` spec and the monitor sample.

This is the one place these shapes are defined. ``dm detect`` prints ``spec.groups`` built from
these Structs, the device agent publishes them on the bus, and the control plane writes them into
the ``Devices`` CRD, so a ``kubectl get devices NODE -o yaml`` and a ``dm detect`` can be diffed.

Invariants:

- camelCase on the wire (``rename="camel"``), Python names in snake_case;
- a field the hardware did not report is ``None`` and omitted, never a made-up ``0``;
- groups are ordered by manufacturer then by their first accelerator's index, accelerators by
  index (:func:`canonical_groups`), so equal hardware always encodes to equal bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

import msgspec
from msgspec import Meta

from bus.bounds import (
    Celsius,
    Counter,
    Index,
    Kib,
    Mhz,
    Mib,
    Name,
    Percent,
    Ratio,
    Small,
    Watts,
)

__all__ = [
    "Accelerator",
    "AcceleratorSample",
    "AcceleratorStatus",
    "DeviceGroup",
    "LogicalSliced",
    "MigInstanceSample",
    "MonitorSample",
    "PhysicalSliced",
    "SliceProfile",
    "Topology",
    "canonical_groups",
    "disambiguated_ids",
    "group_id",
]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Base of every wire shape: immutable, keyword-only, camelCase, absent fields omitted."""


class LogicalSliced(_Wire, frozen=True, kw_only=True):
    """Software slicing a card offers: up to ``count`` tenants sharing its cores and memory."""

    cores_percentage_overcommit: bool
    count: Small


class SliceProfile(_Wire, frozen=True, kw_only=True):
    """One hardware partition profile (an NVIDIA MIG GPU-instance profile such as ``1g.18gb``)."""

    name: Name
    memory_mib: Mib
    compute_slices: Small
    memory_slices: Small
    count: Small
    """How many instances of this profile fit on an empty card."""


class PhysicalSliced(_Wire, frozen=True, kw_only=True):
    """Hardware partitioning a card is configured for (MIG mode on)."""

    profiles: Annotated[tuple[SliceProfile, ...], Meta(max_length=256)] = ()
    count: Small = 0
    """The largest ``count`` of any profile: sizes the partitioned token pool."""


class AcceleratorStatus(_Wire, frozen=True, kw_only=True):
    unhealthy: bool
    logical_sliced: LogicalSliced | None = None
    physical_sliced: PhysicalSliced | None = None


class Topology(_Wire, frozen=True, kw_only=True):
    """Where a card sits: PCI address and path, and the NUMA node and CPUs next to it."""

    pci_bus_id: Name | None = None
    """Lowercase ``dddd:bb:dd.f``."""
    pci_root_id: Name | None = None
    """The outermost PCI bridge above the card (not the root complex)."""
    pci_switches: Annotated[tuple[Name, ...], Meta(max_length=64)] | None = None
    """The bridge path above the card, innermost first (the outermost is ``pci_root_id``)."""
    numa_affinity: Name | None = None
    """A node list such as ``0`` or ``0-1``."""
    cpu_affinity: Annotated[str, Meta(max_length=16384)] | None = None
    """A CPU list such as ``0-13,28-41``."""


class Accelerator(_Wire, frozen=True, kw_only=True):
    id: Name
    """The vendor's unique id (``GPU-…``); never a PCI address."""
    index: Index
    """Logical index from 0, in detection order within the manufacturer."""
    physical_indexes: Annotated[tuple[Index, ...], Meta(max_length=16)] | None = None
    """Device-node numbers: NVIDIA ``[minor of /dev/nvidiaN]``; AMD ``[cardN, renderD minor]``."""
    topology: Topology | None = None
    status: AcceleratorStatus


class DeviceGroup(_Wire, frozen=True, kw_only=True):
    """Accelerators of one product on one node: one entry of ``Devices.spec.groups``."""

    id: Name
    manufacturer: Name
    name: Name
    memory: Mib | None = None
    """MiB per accelerator."""
    cores: Annotated[int, Meta(ge=0, le=1_048_576)] | None = None
    """Streaming multiprocessors (NVIDIA) or compute units (AMD) per accelerator."""
    driver_version: Name | None = None
    runtime_version: Name | None = None
    """``major.minor`` of the CUDA the driver supports, or of the installed ROCm."""
    compute_capability: Name | None = None
    family: Name | None = None
    simulated: bool = False
    """True only for accelerators simulated from a profile; omitted for real hardware."""
    accelerators: Annotated[tuple[Accelerator, ...], Meta(max_length=1024)] = ()


class MigInstanceSample(_Wire, frozen=True, kw_only=True):
    """One MIG device (a compute instance of a GPU instance) of a partitioned card."""

    uuid: Name
    """The ``MIG-`` UUID."""
    gpu_instance_id: Small
    compute_instance_id: Small | None = None
    profile: Name | None = None
    """The GPU-instance profile, e.g. ``1g.10gb``."""
    memory: Mib | None = None
    """MiB total."""
    memory_usage: Mib | None = None
    """MiB used."""
    gr_engine_active: Ratio | None = None
    """The GPU instance's activity ratios 0-1 (NVML GPM, Hopper on), as on the card below."""
    sm_active: Ratio | None = None
    sm_occupancy: Ratio | None = None
    dram_active: Ratio | None = None
    tensor_active: Ratio | None = None


class AcceleratorSample(_Wire, frozen=True, kw_only=True):
    """One accelerator's utilization at a moment. Percentages are integers 0-100.

    The fields after ``unhealthy`` were added within v1 (optional: absent where the hardware
    or its library does not report them, and from older agents).
    """

    id: Name
    memory: Mib | None = None
    """MiB total, driver-reserved memory included."""
    memory_usage: Mib | None = None
    """MiB used."""
    memory_utilization: Percent | None = None
    cores_utilization: Percent | None = None
    temperature: Celsius | None = None
    """Degrees Celsius."""
    power_usage: Watts | None = None
    """Watts drawn."""
    unhealthy: bool
    memory_free: Mib | None = None
    """MiB free."""
    memory_reserved: Mib | None = None
    """MiB the driver reserved (``memory`` = free + used + reserved)."""
    memory_copy_utilization: Percent | None = None
    """Percent of time memory was read or written."""
    encoder_utilization: Percent | None = None
    decoder_utilization: Percent | None = None
    memory_temperature: Celsius | None = None
    """Memory (HBM) temperature, degrees Celsius."""
    sm_clock: Mhz | None = None
    """MHz."""
    memory_clock: Mhz | None = None
    """MHz."""
    energy: Counter | None = None
    """Millijoules consumed since the driver was last loaded (a counter)."""
    pcie_tx_throughput: Kib | None = None
    """KB/s sent over PCIe, over the driver's last 20 ms window."""
    pcie_rx_throughput: Kib | None = None
    """KB/s received over PCIe."""
    pcie_replays: Counter | None = None
    """PCIe replays since the driver loaded (a counter)."""
    remapped_rows_correctable: Counter | None = None
    """Memory rows remapped for correctable errors (a counter)."""
    remapped_rows_uncorrectable: Counter | None = None
    """Memory rows remapped for uncorrectable errors (a counter)."""
    row_remap_failed: bool | None = None
    """A row remapping failed: the card needs service."""
    retired_pages_single_bit: Counter | None = None
    """Pages retired for repeated single-bit ECC errors (cards before row remapping)."""
    retired_pages_double_bit: Counter | None = None
    """Pages retired for double-bit ECC errors."""
    nvlink_links: Small | None = None
    """NVLink links up; absent where the card has none."""
    nvlink_tx: Counter | None = None
    """KiB of data sent over all NVLink links (a counter)."""
    nvlink_rx: Counter | None = None
    """KiB of data received over all NVLink links (a counter)."""
    mig_instances: Annotated[tuple[MigInstanceSample, ...], Meta(max_length=64)] | None = None
    """The MIG devices of a card in MIG mode."""
    gr_engine_active: Ratio | None = None
    """Ratio 0-1 of the interval since the last sample the graphics/compute engine was busy
    (NVML GPM, Hopper on; DCGM's ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``); given in MIG mode too."""
    sm_active: Ratio | None = None
    """Ratio 0-1: SMs busy over the interval (``DCGM_FI_PROF_SM_ACTIVE``)."""
    sm_occupancy: Ratio | None = None
    """Ratio 0-1: resident warps against the maximum (``DCGM_FI_PROF_SM_OCCUPANCY``)."""
    dram_active: Ratio | None = None
    """Ratio 0-1 of the peak DRAM bandwidth used (``DCGM_FI_PROF_DRAM_ACTIVE``)."""
    tensor_active: Ratio | None = None
    """Ratio 0-1 of the tensor pipes' peak used over the interval (GPM ``ANY_TENSOR_UTIL``;
    ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``). Added within v1: absent before Hopper and from older
    agents."""


class MonitorSample(_Wire, frozen=True, kw_only=True):
    """What ``dm monitor`` prints per manufacturer and what the agent publishes every period."""

    manufacturer: Name
    timestamp: Annotated[str, Meta(max_length=64)]
    """RFC 3339 with nanoseconds and the local UTC offset."""
    simulated: bool = False
    accelerators: Annotated[tuple[AcceleratorSample, ...], Meta(max_length=1024)] = ()


_NOT_SLUG = re.compile(r"[^a-z0-9]+")


def group_id(manufacturer: str, name: str) -> str:
    """Return the group id for a product name: lowercased, dash-separated.

    ``NVIDIA H200`` → ``nvidia-h200``. AMD's marketing names start with the company
    (``AMD Radeon RX 7800 XT``); the id drops it (``radeon-rx-7800-xt``), as the reference does.
    """
    slug = _NOT_SLUG.sub("-", name.lower()).strip("-")
    if manufacturer == "amd" and slug.startswith("amd-"):
        slug = slug[len("amd-") :]
    return slug or manufacturer


def disambiguated_ids(keys: Iterable[tuple[str, int | None]]) -> dict[tuple[str, int | None], str]:
    """Map each (base group id, memory MiB) to its final id.

    A base id shared by products of different memory sizes (a 64 GB and a 128 GB variant) gets a
    ``-<GiB>g`` suffix, GiB rounded half up, so each id names one memory size; an id that is
    already unique, or whose memory is unknown, stays as it is.
    """
    unique = list(dict.fromkeys(keys))
    bases = [base for base, _ in unique]
    return {
        (base, memory): f"{base}-{(memory + 512) // 1024}g"
        if bases.count(base) > 1 and memory is not None
        else base
        for base, memory in unique
    }


def canonical_groups(groups: Iterable[DeviceGroup]) -> list[DeviceGroup]:
    """Order groups by manufacturer then first accelerator, and accelerators by index."""
    ordered = [
        msgspec.structs.replace(g, accelerators=tuple(sorted(g.accelerators, key=_by_index)))
        for g in groups
    ]
    return sorted(ordered, key=_group_key)


def _by_index(accelerator: Accelerator) -> int:
    return accelerator.index


def _group_key(group: DeviceGroup) -> tuple[str, int, str]:
    first = group.accelerators[0].index if group.accelerators else -1
    return (group.manufacturer, first, group.id)

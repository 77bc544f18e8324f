"""The simulated-hardware profile: a YAML file describing a node's cards, vendor by vendor.

Field names say their units (``memoryTotalMib``, ``powerMw``, ``vramUsedBytes``) because each
vendor reports in different ones and the backends must convert exactly as they would on real
hardware. YAML anchors and merge keys (``<<: *h200``) keep eight-card profiles short.

Decoding is strict: an unknown field is an error naming its path, so a typo in a profile cannot
silently simulate a different card.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Final

import msgspec
import msgspec.yaml

from agent.devices.simulation.load import LoadPattern
from agent.errors import ProfileError
from kit.files import InputRefused, read_capped


class _Profile(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    pass


class MigProfile(_Profile, frozen=True, kw_only=True):
    """One MIG GPU-instance profile as NVML describes it (``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    id: int
    """NVML profile index (``NVML_GPU_INSTANCE_PROFILE_1_SLICE`` = 0, ...)."""
    name: str
    """Without NVML's ``MIG`` prefix, e.g. ``1g.18gb`` or ``1g.18gb+me``."""
    memory_mib: int
    slice_count: int
    """Compute (GPC) slices."""
    instance_count: int
    """How many fit on an empty card."""
    multiprocessor_count: int
    placement_size: int
    """Memory slices one instance occupies."""
    placement_starts: tuple[int, ...] = ()
    """Legal start slices on an empty card; empty means the profile has no legal placement."""


class NvidiaCard(_Profile, frozen=True, kw_only=True):
    uuid: str
    name: str
    bus_id: str
    """Lowercase ``dddd:bb:dd.f``."""
    minor: int | None = None
    device_id: int = 0x2335
    numa_node: int | None = None
    cpu_list: str | None = None
    bridges: tuple[str, ...] = ()
    """PCI bridges above the card, outermost first."""
    memory_total_mib: int
    memory_reserved_mib: int = 0
    cuda_cores: int | None = None
    compute_capability: tuple[int, int]
    architecture: int | None = None
    """NVML architecture enum (9 = Hopper); None makes the call unsupported."""
    mig_mode: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    memory_used_mib: int = 0
    utilization_percent: int | None = 0
    temperature_c: int | None = None
    power_mw: int | None = None
    faults: dict[str, str] = {}
    """NVML function name → error name (``GPU_IS_LOST``, ``NOT_SUPPORTED``, ...) it raises."""
    xids: tuple[int, ...] = ()
    """XID events this card reports, in order (consumed by the device agent's health loop)."""
    # The DCGM exporter's default fields (docs/metrics.md); None: the card does not report it.
    memory_copy_percent: int | None = 0
    encoder_percent: int | None = None
    decoder_percent: int | None = None
    memory_temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    energy_mj: int | None = None
    """Energy counter at start; it then grows by the card's power draw."""
    pcie_tx_kbps: int | None = None
    pcie_rx_kbps: int | None = None
    pcie_replays: int | None = None
    remapped_rows: tuple[int, int, bool] | None = None
    """(correctable, uncorrectable, failed); None before Ampere (no row remapping)."""
    retired_pages: tuple[int, int] | None = None
    """(single-bit, double-bit) retired pages; None from Ampere on (row remapping instead)."""
    nvlink_links: int = 0
    """NVLink links up; 0: the card has no NVLink."""
    nvlink_kibps: int = 0
    """KiB/s of NVLink data each way, accumulated into the TX and RX counters."""


class NvidiaHost(_Profile, frozen=True, kw_only=True):
    driver_version: str
    cuda_driver_version: int
    """As NVML reports it: ``12080`` is CUDA 12.8."""
    init_error: str | None = None
    """If set, ``nvmlInit`` raises this error (``DRIVER_NOT_LOADED``, ``LIBRARY_NOT_FOUND``)."""
    cards: tuple[NvidiaCard, ...] = ()
    load: LoadPattern | None = None
    """How the cards' usage moves over time (:mod:`.load`); None: the readings above, always."""


class AmdCard(_Profile, frozen=True, kw_only=True):
    unique_id: str | None
    """16 hex digits from the amdgpu ``unique_id`` attribute; the id becomes ``GPU-<unique_id>``."""
    name: str
    """Marketing name, written into the simulated ``amdgpu.ids`` table."""
    bus_id: str
    device_id: int
    revision: int
    subsystem_vendor: int = 0x1002
    subsystem_device: int = 0
    card: int
    """N of ``/dev/dri/cardN``."""
    render_minor: int
    """M of ``/dev/dri/renderDM``."""
    numa_node: int | None = None
    cpu_list: str | None = None
    bridges: tuple[str, ...] = ()
    vram_total_bytes: int
    vram_used_bytes: int = 0
    busy_percent: int | None = 0
    edge_temperature_mc: int | None = None
    power_average_uw: int | None = None
    simd_count: int
    simd_per_cu: int = 2
    gfx_target_version: int
    """KFD encoding: ``110001`` is gfx1101."""


class AmdHost(_Profile, frozen=True, kw_only=True):
    module_version: str | None = None
    """``/sys/module/amdgpu/version``; absent for the in-tree driver."""
    rocm_version: str | None = None
    """``/opt/rocm/.info/version``; absent when ROCm is not installed."""
    cards: tuple[AmdCard, ...] = ()
    load: LoadPattern | None = None
    """How the cards' usage moves over time (:mod:`.moving`); None: the readings above."""


class LibCard(_Profile, frozen=True, kw_only=True):
    """What every card read through a vendor library has: its PCI place and injected faults."""

    bus_id: str
    """Lowercase ``dddd:bb:dd.f``; chips of one multi-chip card may share it."""
    bridges: tuple[str, ...] = ()
    pci_device_id: int
    pci_class: int = 0x120000
    """Processing accelerator; display controllers are ``0x0302xx``/``0x0300xx``."""
    numa_node: int | None = None
    cpu_list: str | None = None
    faults: dict[str, str] = {}
    """C function name → the vendor's error name it returns for this card."""


class LibHost(_Profile, frozen=True, kw_only=True):
    init_error: str | None = None
    """If set, the library's init call returns this error name."""
    library_installed: bool = True
    """False: the cards are on the bus but the library cannot be loaded (``dlopen`` fails)."""
    load: LoadPattern | None = None
    """How the cards' usage moves over time (:mod:`.moving`); None: the readings above."""


class AscendChip(LibCard, frozen=True, kw_only=True):
    """One NPU chip as DCMI reports it (a card may hold several)."""

    card_id: int
    device_id: int = 0
    """The chip within its card."""
    logic_id: int
    physical_id: int
    chip_name: str
    aicore_count: int
    die_id: tuple[int, int, int, int, int]
    hbm: bool = True
    """False for DDR products: the HBM call answers size 0 and memory comes from v3."""
    memory_total_mib: int
    memory_used_mib: int = 0
    aicore_utilization: int = 0
    temperature_c: int
    power_deciwatts: int
    """DCMI's unit: 0.1 W."""


class AscendHost(LibHost, frozen=True, kw_only=True):
    driver_version: str | None = None
    cann_version: str | None = None
    """The ``Version=`` of the CANN toolkit's ``version.info``; None: no toolkit on the host."""
    mcu_cards: tuple[int, ...] = ()
    """Cards that also list an MCU unit after their chips (A3 boards); detection must skip it."""
    api: int = 1
    """2: a V2-only driver (Ascend 950): every ``dcmi_*`` call, init included, answers
    ``NOT_SUPPORT`` and the ``dcmiv2_*`` calls address a chip by its logic id."""
    chips: tuple[AscendChip, ...] = ()


class DrmCard(LibCard, frozen=True, kw_only=True):
    """A card the kernel also exposes as DRM nodes (``/dev/dri/cardN``, ``renderD<M>``)."""

    card: int
    render_minor: int


class MetaxCard(DrmCard, frozen=True, kw_only=True):
    """A MetaX GPU as MXSML reports it, in MXSML's units."""

    uuid: str
    name: str
    brand: int = 2
    """1 N-class, 2 C-class, 3 G-class."""
    mode: int = 0
    """0 bare metal, 1 PF, 2 VF."""
    driver_version: str
    vram_total_kb: int
    vram_used_kb: int = 0
    hotspot_centidegrees: int
    """Temperature × 100, as MXSML reports it."""
    board_ways_mw: tuple[int, ...]
    """Power per supply way, mW; the board's power is their sum."""
    xcore_percent: int = 0


class MetaxHost(LibHost, frozen=True, kw_only=True):
    maca_version: str | None = None
    cards: tuple[MetaxCard, ...] = ()


class CambriconCard(LibCard, frozen=True, kw_only=True):
    """An MLU as CNDev reports it."""

    uuid: str
    """Bare, as CNDev gives it (tools print ``MLU-`` before it)."""
    name: str
    name_id: int
    """``cndevNameEnum_t`` (23 is MLU370), for drivers without the name-string call."""
    driver_version: tuple[int, int, int]
    memory_total_mib: int
    memory_used_mib: int = 0
    utilization_percent: int = 0
    chip_temperature_c: int
    power_w: int


class CambriconHost(LibHost, frozen=True, kw_only=True):
    neuware_version: str | None = None
    """Written to ``/usr/local/neuware/version.txt``; None: no Neuware on the host."""
    name_strings: bool = True
    """False: an older driver without ``cndevGetCardNameStringByDevId``."""
    cards: tuple[CambriconCard, ...] = ()


class MthreadsCard(DrmCard, frozen=True, kw_only=True):
    """A Moore Threads GPU as MTML reports it."""

    uuid: str
    name: str
    audio_bus_id: str | None = None
    """The card's HDMI/DP audio function (same vendor id, class 0x0403), if simulated."""
    memory_total_mib: int
    """Reported in bytes by the library."""
    memory_used_mib: int = 0
    gpu_cores: int | None = None
    """None: ``NOT_SUPPORTED`` (no public figure)."""
    utilization_percent: int = 0
    temperature_c: int
    power_mw: int


class MthreadsHost(LibHost, frozen=True, kw_only=True):
    driver_version: str
    cards: tuple[MthreadsCard, ...] = ()


class HygonMigProfile(_Profile, frozen=True, kw_only=True):
    """One DMI MIG profile of a DCU (``dmiGpuInstanceProfileInfo_t``)."""

    name: str
    memory_mib: int
    slice_count: int
    """1 to 4; the library is asked by ``slice_count - 1``."""
    instance_count: int
    cu_count: int = 0


class HygonCard(DrmCard, frozen=True, kw_only=True):
    """A Hygon DCU as DTK's ROCm SMI and KFD report it, in their units."""

    unique_id: int
    name: str
    vram_total_bytes: int
    vram_used_bytes: int = 0
    busy_percent: int = 0
    edge_temperature_mc: int
    power_average_uw: int
    power_uw: int | None = None
    """``rsmi_dev_power_get``'s reading; None: the library refuses that call (older DTK)."""
    simd_count: int
    simd_per_cu: int = 4
    gfx_target_version: int
    """KFD encoding: ``90208`` is gfx928."""
    mig_profiles: tuple[HygonMigProfile, ...] = ()


class HygonHost(LibHost, frozen=True, kw_only=True):
    module_version: str | None = None
    """``/sys/module/hycu/version``; None: the module publishes none."""
    dtk_version: str | None = None
    """``/opt/dtk/.info/version``; None: no DTK on the host."""
    mig_library: bool = False
    """Whether DTK's ``libhydmi_mig.so`` is installed."""
    mig_mode: bool = False
    """The node-wide MIG switch (only read through the MIG library)."""
    mig_gap_code: int = 3
    """What the MIG library answers for a slice count a card has no profile at: NOT_SUPPORTED
    (3), NOT_FOUND (6) or INVALID_ARGUMENT (2), all routine per gpustack-runtime's binding."""
    cards: tuple[HygonCard, ...] = ()


class CloneMigProfile(_Profile, frozen=True, kw_only=True):
    """One GPU-instance profile of an NVML clone's MIG (HGML)."""

    id: int
    slice_count: int
    instance_count: int
    multiprocessor_count: int = 0
    memory_mib: int
    placement_size: int
    placement_starts: tuple[int, ...] = ()


class CloneCard(LibCard, frozen=True, kw_only=True):
    """A card of an NVML clone (IXML, HGML): NVML's calls, units and status codes."""

    uuid: str
    name: str
    minor: int | None = None
    memory_total_mib: int
    """Reported in bytes by the library."""
    memory_used_mib: int = 0
    gpu_cores: int | None = None
    compute_capability: tuple[int, int] | None = None
    """None: the call answers ``NOT_SUPPORTED``."""
    utilization_percent: int = 0
    temperature_c: int
    power_mw: int | None = None
    """None: ``NOT_SUPPORTED`` (``ixsmi`` shows ``N/A``)."""
    mig_mode: bool = False
    mig_profiles: tuple[CloneMigProfile, ...] = ()


class CloneHost(LibHost, frozen=True, kw_only=True):
    driver_version: str
    runtime_version: int | None = None
    """CUDA-style ``major*1000 + minor*10 + patch``; None: ``NOT_SUPPORTED``."""
    cards: tuple[CloneCard, ...] = ()


LibSection = CambriconHost | CloneHost | HygonHost | MetaxHost | MthreadsHost


class Profile(_Profile, frozen=True, kw_only=True):
    description: str
    kernel_release: str = "6.8.0-simulated"
    nvidia: NvidiaHost | None = None
    amd: AmdHost | None = None
    ascend: AscendHost | None = None
    cambricon: CambriconHost | None = None
    hygon: HygonHost | None = None
    iluvatar: CloneHost | None = None
    metax: MetaxHost | None = None
    mthreads: MthreadsHost | None = None
    thead: CloneHost | None = None

    def library_cards(self) -> dict[str, tuple[LibCard, ...]]:
        """Manufacturer → its library-read cards, for the PCI tree."""
        sections: dict[str, tuple[LibCard, ...]] = {}
        if self.ascend is not None:
            sections["ascend"] = self.ascend.chips
        for key in ("cambricon", "hygon", "iluvatar", "metax", "mthreads", "thead"):
            section: LibSection | None = getattr(self, key)
            if section is not None:
                sections[key] = section.cards
        return sections


PACKAGED = "agent.devices.simulation.builtin"
PROFILE_BYTES: Final = 1024 * 1024
"""The largest profile file read: the biggest packaged one is a few KiB."""


def packaged_names() -> list[str]:
    """Names of the profiles shipped with the package (without ``.yaml``)."""
    files = resources.files(PACKAGED)
    return sorted(p.name.removesuffix(".yaml") for p in files.iterdir() if p.name.endswith(".yaml"))


def load(name_or_path: str) -> Profile:
    """Load a packaged profile by name, or a profile file by path.

    :raises ProfileError: the file is missing or does not match the schema (with the field path).
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.path.lexists(path):
        if not os.path.lexists(path):
            raise ProfileError(f"no profile file {name_or_path!r}")
        try:  # a regular file up to the cap: never /dev/zero, a FIFO or a directory
            data = read_capped(path, limit=PROFILE_BYTES)
        except InputRefused as e:
            raise ProfileError(f"cannot read profile {e}") from e
    else:
        try:
            data = resources.files(PACKAGED).joinpath(f"{name_or_path}.yaml").read_bytes()
        except (FileNotFoundError, IsADirectoryError) as e:
            known = ", ".join(packaged_names())
            raise ProfileError(f"no profile {name_or_path!r} (packaged: {known})") from e
    try:
        return msgspec.yaml.decode(data, type=Profile)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ProfileError(f"invalid profile {name_or_path!r}: {e}") from e

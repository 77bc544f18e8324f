"""The simulated-hardware profile: a YAML file describing a node's cards, vendor by vendor.

Field names say their units (``memoryTotalMib``, ``powerMw``, ``vramUsedBytes``) because each
vendor reports in different ones and the backends must convert exactly as they would on real
hardware. YAML anchors and merge keys (``<<: *h200``) keep eight-card profiles short.

Decoding is strict: an unknown field is an error naming its path, so a typo in a profile cannot
silently simulate a different card.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import msgspec
import msgspec.yaml

from agent.errors import ProfileError


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


class Profile(_Profile, frozen=True, kw_only=True):
    description: str
    kernel_release: str = "6.8.0-simulated"
    nvidia: NvidiaHost | None = None
    amd: AmdHost | None = None


PACKAGED = "agent.devices.simulation.builtin"


def packaged_names() -> list[str]:
    """Names of the profiles shipped with the package (without ``.yaml``)."""
    files = resources.files(PACKAGED)
    return sorted(p.name.removesuffix(".yaml") for p in files.iterdir() if p.name.endswith(".yaml"))


def load(name_or_path: str) -> Profile:
    """Load a packaged profile by name, or a profile file by path.

    :raises ProfileError: the file is missing or does not match the schema (with the field path).
    """
    path = Path(name_or_path)
    try:
        if path.suffix in (".yaml", ".yml") or path.exists():
            data = path.read_bytes()
        else:
            data = resources.files(PACKAGED).joinpath(f"{name_or_path}.yaml").read_bytes()
    except (FileNotFoundError, IsADirectoryError) as e:
        known = ", ".join(packaged_names())
        raise ProfileError(f"no profile {name_or_path!r} (packaged: {known})") from e
    except OSError as e:
        raise ProfileError(f"cannot read profile {name_or_path!r}: {e}") from e
    try:
        return msgspec.yaml.decode(data, type=Profile)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ProfileError(f"invalid profile {name_or_path!r}: {e}") from e

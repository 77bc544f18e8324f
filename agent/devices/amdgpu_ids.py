"""Names for AMD accelerators: marketing name, gfx target and amdgpu family, from tables alone.

The kernel gives numbers (PCI device and revision ids, KFD's ``gfx_target_version``); these pure
functions turn them into what a person reads. Marketing names come from libdrm's ``amdgpu.ids``
(the table ``amdgpu_get_marketing_name`` uses), then from ``pci.ids``; both are host files read
through :class:`HostFS`, so a container without them mounted falls back to a generic name.
"""

from __future__ import annotations

from agent.devices.hostfs import HostFS

AMDGPU_IDS_PATHS = ("/usr/share/libdrm/amdgpu.ids", "/opt/amdgpu/share/libdrm/amdgpu.ids")
PCI_IDS_PATHS = ("/usr/share/hwdata/pci.ids", "/usr/share/misc/pci.ids", "/usr/share/pci.ids")
_AMD_VENDOR = "1002"

# amdgpu family names, from AMDGPU_FAMILY_* in the kernel's include/uapi/drm/amdgpu_drm.h (the
# same header libdrm ships). The family a chip gets is assigned by GC IP version in
# drivers/gpu/drm/amd/amdgpu/amdgpu_discovery.c (and amdgpu_device.c for pre-discovery chips);
# KFD's gfx_target_version for each GC IP version comes from drivers/gpu/drm/amd/amdkfd/
# kfd_device.c. The table below joins the two: gfx target (major, minor, stepping) → family.
_SI, _CI, _KV, _VI, _CZ = "SI", "CI", "KV", "VI", "CZ"  # 110, 120, 125, 130, 135
_AI, _RV, _NV, _VGH, _YC = "AI", "RV", "NV", "VGH", "YC"  # 141, 142, 143, 144, 146
_GC_10_3_6, _GC_10_3_7 = "GC 10.3.6", "GC 10.3.7"  # 149, 151
_GC_11_0_0, _GC_11_0_1, _GC_11_5_0 = "GC 11.0.0", "GC 11.0.1", "GC 11.5.0"  # 145, 148, 150
_GC_12_0_0 = "GC 12.0.0"  # 152

_FAMILY_BY_TARGET: dict[tuple[int, int, int], str] = {
    (7, 0, 0): _KV,  # gfx700 Kaveri (APU)
    (7, 0, 1): _CI,  # gfx701 Hawaii
    (8, 0, 1): _CZ,  # gfx801 Carrizo (APU)
    (8, 0, 2): _VI,  # gfx802 Tonga, Iceland
    (8, 0, 3): _VI,  # gfx803 Fiji, Polaris
    (9, 0, 2): _RV,  # gfx902 Raven, Picasso (APU, GC 9.1.0)
    (9, 0, 9): _RV,  # gfx909 Raven2 (APU, GC 9.2.2)
    (9, 0, 12): _RV,  # gfx90c Renoir (APU, GC 9.3.0)
    (10, 3, 3): _VGH,  # gfx1033 Van Gogh (APU, GC 10.3.1)
    (10, 3, 5): _YC,  # gfx1035 Yellow Carp / Rembrandt (APU, GC 10.3.3)
    (10, 3, 6): _GC_10_3_6,  # gfx1036 Raphael (APU)
    (10, 3, 7): _GC_10_3_7,  # gfx1037 Mendocino (APU)
    (11, 0, 3): _GC_11_0_1,  # gfx1103 Phoenix (APU, GC 11.0.1 and 11.0.4)
}
"""Exceptions to the per-major default: mostly APUs, which share a gfx major with dGPUs."""

_FAMILY_BY_MAJOR_MINOR: dict[tuple[int, int], str] = {
    (6, 0): _SI,
    (7, 0): _CI,
    (8, 0): _VI,
    (9, 0): _AI,  # gfx900 Vega10 … gfx908 Arcturus, gfx90a Aldebaran
    (9, 4): _AI,  # gfx940-942 (MI300, GC 9.4.3/9.4.4)
    (9, 5): _AI,  # gfx950 (MI350, GC 9.5.0)
    (10, 1): _NV,  # gfx1010-1013 Navi1x
    (10, 3): _NV,  # gfx1030-1034 Navi2x dGPUs
    (11, 0): _GC_11_0_0,  # gfx1100-1102 Navi3x dGPUs (GC 11.0.0, 11.0.2, 11.0.3)
    (11, 5): _GC_11_5_0,  # gfx1150-1153 Strix, Krackan (APU)
    (12, 0): _GC_12_0_0,  # gfx1200-1201 Navi4x
}


def split_target_version(value: int) -> tuple[int, int, int]:
    """Split KFD's decimal ``major*10000 + minor*100 + stepping`` into its parts."""
    return value // 10000, value // 100 % 100, value % 100


def gfx_name(target_version: int) -> str:
    """Format a KFD ``gfx_target_version`` as LLVM's target name.

    Minor and stepping are single hex digits in the name: 110001 → ``gfx1101``, 90402 →
    ``gfx942``, 90010 → ``gfx90a``, 90012 → ``gfx90c``.
    """
    major, minor, stepping = split_target_version(target_version)
    return f"gfx{major}{minor:x}{stepping:x}"


def family_name(target_version: int) -> str | None:
    """Return the amdgpu family name of a gfx target, or None for a target the table lacks."""
    major, minor, stepping = split_target_version(target_version)
    family = _FAMILY_BY_TARGET.get((major, minor, stepping))
    return family or _FAMILY_BY_MAJOR_MINOR.get((major, minor))


def marketing_name(host: HostFS, device: int, revision: int | None) -> str | None:
    """Look a card up in libdrm's ``amdgpu.ids`` by device id and revision; first file wins.

    Lines are ``DEVICE,<tab>REV,<tab>name`` in hex; comments and the version line are skipped.
    """
    if revision is None:
        return None
    for path in AMDGPU_IDS_PATHS:
        text = host.read_text(path)
        if text is None:
            continue
        for line in text.splitlines():
            parts = [p.strip() for p in line.split(",", 2)]
            if line.startswith("#") or len(parts) != 3:
                continue
            if _hex(parts[0]) == device and _hex(parts[1]) == revision and parts[2]:
                return parts[2]
    return None


def pci_ids_name(
    host: HostFS, device: int, subsystem_vendor: int | None, subsystem_device: int | None
) -> str | None:
    """Look a card up in ``pci.ids``: the subsystem (board) name if listed, else the chip name.

    The name gets an ``AMD`` prefix when it has none, so it reads like an ``amdgpu.ids`` name
    (``Radeon RX 7800 XT`` → ``AMD Radeon RX 7800 XT``).
    """
    for path in PCI_IDS_PATHS:
        text = host.read_text(path)
        if text is not None:
            name = _find_in_pci_ids(text, device, subsystem_vendor, subsystem_device)
            if name:
                return name if name.startswith("AMD") else f"AMD {name}"
    return None


def _find_in_pci_ids(
    text: str, device: int, subsystem_vendor: int | None, subsystem_device: int | None
) -> str | None:
    want_device = f"\t{device:04x} "
    want_sub = (
        f"\t\t{subsystem_vendor:04x} {subsystem_device:04x} "
        if subsystem_vendor is not None and subsystem_device is not None
        else None
    )
    in_vendor = False
    chip: str | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            if chip is not None or in_vendor:
                break
            in_vendor = line.startswith(f"{_AMD_VENDOR} ")
        elif in_vendor and chip is None and line.lower().startswith(want_device):
            chip = line[len(want_device) :].strip()
        elif chip is not None and not line.startswith("\t\t"):
            break
        elif chip is not None and want_sub and line.lower().startswith(want_sub):
            return line[len(want_sub) :].strip()
    return chip


def _hex(text: str) -> int | None:
    try:
        return int(text, 16)
    except ValueError:
        return None

"""Write a profile's cards as the kernel would show them, so the real backends run unchanged.

:func:`materialize` lays out, under a root directory, the sysfs, procfs and user-space files the
detectors read: PCI functions under ``/sys/devices/pci<domain>:00/<bridges...>/<bdf>`` with the
relative ``/sys/bus/pci/devices/<bdf>`` links the kernel makes, and for AMD cards the amdgpu
attributes, hwmon sensors, DRM nodes, KFD topology, libdrm's ``amdgpu.ids`` and the ROCm version
file. Nothing here knows how a backend parses these files; it only writes what the kernel (or the
package) writes, in the kernel's formats (hex ids with ``0x``, bytes, m°C, µW, decimal KFD values).

Invariants: every card's PCI address is unique, every bridge sits at one place in the tree, AMD
``cardN`` and ``renderD<M>`` numbers are unique; otherwise :class:`ProfileError`. Writing is
idempotent: rerunning into the same root rewrites the same tree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from agent.devices.hostfs import HostFS
from agent.devices.manufacturers import MANUFACTURERS
from agent.devices.simulation.profiles import (
    AmdCard,
    AmdHost,
    DrmCard,
    HygonHost,
    LibCard,
    NvidiaCard,
    Profile,
)
from agent.errors import ProfileError

__all__ = ["materialize"]

_BDF = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")

NVIDIA_VENDOR = 0x10DE
AMD_VENDOR = 0x1002
_NVIDIA_CLASS = 0x030200  # 3D controller
_AMD_CLASS = 0x030000  # VGA compatible controller
_BRIDGE_CLASS = 0x060400  # PCI-to-PCI bridge
_AUDIO_CLASS = 0x040300  # HDMI/DP audio: same vendor id as the card, not an accelerator
_BRIDGE_VENDOR = 0x1000  # a PCIe switch's ports; the exact vendor does not matter to detection
_BRIDGE_DEVICE = 0xC010

_KFD_NODES = "sys/class/kfd/kfd/topology/nodes"
_AMDGPU_IDS_HEADER = (
    "# List of AMDGPU IDs\n"
    "#\n"
    "# Syntax:\n"
    "# device_id,\trevision_id,\tproduct_name        <-- single tab after comma\n"
    "\n"
    "1.0.0\n"
)


@dataclass(frozen=True)
class _Function:
    """One PCI function to write: the card's identity and where it hangs in the tree."""

    bdf: str
    bridges: tuple[str, ...]
    vendor: int
    device: int
    pci_class: int
    revision: int
    subsystem_vendor: int
    subsystem_device: int
    numa_node: int | None
    cpu_list: str | None
    driver: str


def materialize(profile: Profile, root: Path) -> HostFS:
    """Write the tree for every card of ``profile`` under ``root`` and return a HostFS on it.

    :raises ProfileError: two cards share a PCI address, a bridge is placed in two different
        positions, an AMD card or render number repeats, or a PCI address is malformed.
    """
    nvidia_cards = profile.nvidia.cards if profile.nvidia else ()
    amd_cards = profile.amd.cards if profile.amd else ()
    functions = [_nvidia_function(c) for c in nvidia_cards] + [_amd_function(c) for c in amd_cards]
    for key, cards in profile.library_cards().items():
        functions.extend(_library_functions(key, cards))
    _check_consistent(functions, amd_cards)
    for function in functions:
        _write_function(root, function)
    if profile.amd is not None and amd_cards:
        _write_amd(root, profile.amd)
    _write_library_hosts(root, profile)
    _write(root / "proc/sys/kernel/osrelease", profile.kernel_release + "\n")
    return HostFS(root)


def _nvidia_function(card: NvidiaCard) -> _Function:
    return _Function(
        bdf=_bdf(card.bus_id),
        bridges=tuple(_bdf(b) for b in card.bridges),
        vendor=NVIDIA_VENDOR,
        device=card.device_id,
        pci_class=_NVIDIA_CLASS,
        revision=0xA1,
        subsystem_vendor=NVIDIA_VENDOR,
        subsystem_device=0,
        numa_node=card.numa_node,
        cpu_list=card.cpu_list,
        driver="nvidia",
    )


def _amd_function(card: AmdCard) -> _Function:
    return _Function(
        bdf=_bdf(card.bus_id),
        bridges=tuple(_bdf(b) for b in card.bridges),
        vendor=AMD_VENDOR,
        device=card.device_id,
        pci_class=_AMD_CLASS,
        revision=card.revision,
        subsystem_vendor=card.subsystem_vendor,
        subsystem_device=card.subsystem_device,
        numa_node=card.numa_node,
        cpu_list=card.cpu_list,
        driver="amdgpu",
    )


def _library_functions(key: str, cards: tuple[LibCard, ...]) -> list[_Function]:
    """One PCI function per address: chips of one multi-chip card share theirs."""
    functions: dict[str, _Function] = {}
    for card in cards:
        bdf = _bdf(card.bus_id)
        function = _Function(
            bdf=bdf,
            bridges=tuple(_bdf(b) for b in card.bridges),
            vendor=MANUFACTURERS[key].pci_vendor,
            device=card.pci_device_id,
            pci_class=card.pci_class,
            revision=0x01,
            subsystem_vendor=MANUFACTURERS[key].pci_vendor,
            subsystem_device=0,
            numa_node=card.numa_node,
            cpu_list=card.cpu_list,
            driver=_DRIVERS[key],
        )
        if functions.setdefault(bdf, function) != function:
            raise ProfileError(f"{key} chips at {bdf} disagree on their PCI function")
        audio = getattr(card, "audio_bus_id", None)
        if audio is not None:
            functions[_bdf(audio)] = replace(
                function,
                bdf=_bdf(audio),
                device=0x02FF,
                pci_class=_AUDIO_CLASS,
                driver="snd_hda_intel",
            )
    return list(functions.values())


_DRIVERS = {
    "ascend": "devdrv_device_driver",
    "cambricon": "cambricon",
    "hygon": "hycu",
    "iluvatar": "iluvatar",
    "metax": "metax",
    "mthreads": "mtgpu",
    "thead": "alixpu",
}
"""The kernel driver each manufacturer's cards are bound to (the ``driver`` link's name)."""


def _write_library_hosts(root: Path, profile: Profile) -> None:
    """The host files the library-read backends look at besides the library itself."""
    drm = [c for cards in profile.library_cards().values() for c in cards if isinstance(c, DrmCard)]
    _unique([c.card for c in drm], "card number card")
    _unique([c.render_minor for c in drm], "render minor renderD")
    for card in drm:
        device_dir = _device_dir(_bdf(card.bus_id), tuple(_bdf(b) for b in card.bridges))
        _write_drm(root, device_dir, card)
    if profile.hygon is not None:
        _write_hygon(
            root, profile.hygon, first_node=1 + len(profile.amd.cards if profile.amd else ())
        )
    if profile.cambricon is not None and profile.cambricon.neuware_version is not None:
        text = f"Neuware Version: {profile.cambricon.neuware_version}\n"
        _write(root / "usr/local/neuware/version.txt", text)
    if profile.ascend is not None and profile.ascend.cann_version is not None:
        text = f"Version={profile.ascend.cann_version}\n"
        _write(root / "usr/local/Ascend/ascend-toolkit/latest/runtime/version.info", text)


def _write_hygon(root: Path, host: HygonHost, first_node: int) -> None:
    """KFD nodes for the DCUs (after any AMD ones), the hycu module and DTK's version file."""
    if host.cards:
        _write_kfd_cpu_node(root)
    for offset, card in enumerate(host.cards):
        domain, bus, dev, fn = _split_bdf(_bdf(card.bus_id))
        props = {
            "cpu_cores_count": 0,
            "simd_count": card.simd_count,
            "mem_banks_count": 1,
            "simd_per_cu": card.simd_per_cu,
            "gfx_target_version": card.gfx_target_version,
            "vendor_id": MANUFACTURERS["hygon"].pci_vendor,
            "device_id": card.pci_device_id,
            "location_id": bus << 8 | dev << 3 | fn,
            "domain": domain,
            "drm_render_minor": card.render_minor,
            "unique_id": card.unique_id,
        }
        _write_kfd_node(root, first_node + offset, props, gpu_id=0x2000 + offset)
    (root / "sys/module/hycu").mkdir(parents=True, exist_ok=True)
    if host.module_version is not None:
        _write(root / "sys/module/hycu/version", host.module_version + "\n")
    if host.dtk_version is not None:
        _write(root / "opt/dtk/.info/version", host.dtk_version + "\n")


def _split_bdf(bdf: str) -> tuple[int, int, int, int]:
    domain, bus, rest = bdf.split(":")
    dev, fn = rest.split(".")
    return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)


def _bdf(bus_id: str) -> str:
    bdf = bus_id.strip().lower()
    if not _BDF.match(bdf):
        raise ProfileError(f"PCI address {bus_id!r} is not of the form dddd:bb:dd.f")
    return bdf


def _check_consistent(functions: list[_Function], amd_cards: Iterable[AmdCard]) -> None:
    seen: set[str] = set()
    parents: dict[str, tuple[str, ...]] = {}
    for f in functions:
        if f.bdf in seen:
            raise ProfileError(f"two cards have the PCI address {f.bdf}")
        seen.add(f.bdf)
        chain = (*f.bridges, f.bdf)
        for depth, node in enumerate(chain):
            above = chain[:depth]
            if parents.setdefault(node, above) != above:
                raise ProfileError(f"PCI function {node} appears under two different bridges")
    _unique([c.card for c in amd_cards], "AMD card number card")
    _unique([c.render_minor for c in amd_cards], "AMD render minor renderD")


def _unique(numbers: list[int], what: str) -> None:
    for n in numbers:
        if numbers.count(n) > 1:
            raise ProfileError(f"{what}{n} is used by two cards")


def _device_dir(bdf: str, bridges: tuple[str, ...]) -> str:
    """The host path of a function: ``/sys/devices/pci0000:00/<bridges...>/<bdf>``."""
    domain = bdf.split(":", 1)[0]
    return "/".join(("sys/devices", f"pci{domain}:00", *bridges, bdf))


def _write_function(root: Path, f: _Function) -> None:
    for depth, bridge in enumerate(f.bridges):
        bridge_dir = _device_dir(bridge, f.bridges[:depth])
        _write_pci_identity(root / bridge_dir, _BRIDGE_VENDOR, _BRIDGE_DEVICE, _BRIDGE_CLASS, 0)
        _link_pci(root, bridge, bridge_dir)
    device_dir = _device_dir(f.bdf, f.bridges)
    base = root / device_dir
    _write_pci_identity(base, f.vendor, f.device, f.pci_class, f.revision)
    _write(base / "subsystem_vendor", f"0x{f.subsystem_vendor:04x}\n")
    _write(base / "subsystem_device", f"0x{f.subsystem_device:04x}\n")
    _write(base / "numa_node", f"{-1 if f.numa_node is None else f.numa_node}\n")
    _write(base / "local_cpulist", f"{f.cpu_list or ''}\n")
    _link_pci(root, f.bdf, device_dir)
    driver_dir = f"sys/bus/pci/drivers/{f.driver}"
    (root / driver_dir).mkdir(parents=True, exist_ok=True)
    _symlink(root, f"{device_dir}/driver", driver_dir)
    _symlink(root, f"{driver_dir}/{f.bdf}", device_dir)


def _write_pci_identity(base: Path, vendor: int, device: int, pci_class: int, rev: int) -> None:
    _write(base / "vendor", f"0x{vendor:04x}\n")
    _write(base / "device", f"0x{device:04x}\n")
    _write(base / "class", f"0x{pci_class:06x}\n")
    _write(base / "revision", f"0x{rev:02x}\n")
    # The first 16 bytes of configuration space, which some tools check is non-empty.
    config = (
        vendor.to_bytes(2, "little")
        + device.to_bytes(2, "little")
        + bytes(4)
        + bytes([rev])
        + pci_class.to_bytes(3, "little")
        + bytes(4)
    )
    (base / "config").write_bytes(config)


def _link_pci(root: Path, bdf: str, device_dir: str) -> None:
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    _symlink(root, f"sys/bus/pci/devices/{bdf}", device_dir)


def _write_amd(root: Path, host: AmdHost) -> None:
    """amdgpu attributes, hwmon, DRM nodes and KFD topology in PCI order, plus host files."""
    cards = sorted(host.cards, key=lambda c: _bdf(c.bus_id))
    _write_kfd_cpu_node(root)
    for position, card in enumerate(cards):
        device_dir = _device_dir(_bdf(card.bus_id), tuple(_bdf(b) for b in card.bridges))
        _write_amdgpu_attributes(root / device_dir, card)
        _write_hwmon(root, device_dir, position, card)
        _write_drm(root, device_dir, card)
        _write_kfd_gpu_node(root, position + 1, card)
    (root / "sys/module/amdgpu").mkdir(parents=True, exist_ok=True)
    _symlink(root, "sys/module/amdgpu/drivers/pci:amdgpu", "sys/bus/pci/drivers/amdgpu")
    if host.module_version is not None:
        _write(root / "sys/module/amdgpu/version", host.module_version + "\n")
    if host.rocm_version is not None:
        _write(root / "opt/rocm/.info/version", host.rocm_version + "\n")
    _write(root / "usr/share/libdrm/amdgpu.ids", _amdgpu_ids(cards))


def _write_amdgpu_attributes(base: Path, card: AmdCard) -> None:
    if card.unique_id is not None:
        _write(base / "unique_id", card.unique_id.lower() + "\n")
    _write(base / "mem_info_vram_total", f"{card.vram_total_bytes}\n")
    _write(base / "mem_info_vram_used", f"{card.vram_used_bytes}\n")
    if card.busy_percent is not None:
        _write(base / "gpu_busy_percent", f"{card.busy_percent}\n")


def _write_hwmon(root: Path, device_dir: str, number: int, card: AmdCard) -> None:
    hwmon_dir = f"{device_dir}/hwmon/hwmon{number}"
    base = root / hwmon_dir
    _write(base / "name", "amdgpu\n")
    if card.edge_temperature_mc is not None:
        _write(base / "temp1_input", f"{card.edge_temperature_mc}\n")
        _write(base / "temp1_label", "edge\n")
    if card.power_average_uw is not None:
        _write(base / "power1_average", f"{card.power_average_uw}\n")
    (root / "sys/class/hwmon").mkdir(parents=True, exist_ok=True)
    _symlink(root, f"sys/class/hwmon/hwmon{number}", hwmon_dir)


def _write_drm(root: Path, device_dir: str, card: AmdCard | DrmCard) -> None:
    (root / "sys/class/drm").mkdir(parents=True, exist_ok=True)
    for node in (f"card{card.card}", f"renderD{card.render_minor}"):
        node_dir = f"{device_dir}/drm/{node}"
        (root / node_dir).mkdir(parents=True, exist_ok=True)
        # The kernel's own spelling, which names the function: ../../../0000:04:00.0
        _place_link(root / node_dir / "device", f"../../../{device_dir.rsplit('/', 1)[1]}")
        _symlink(root, f"sys/class/drm/{node}", node_dir)


def _write_kfd_cpu_node(root: Path) -> None:
    props = {"cpu_cores_count": 1, "simd_count": 0, "mem_banks_count": 1, "gfx_target_version": 0}
    _write_kfd_node(root, 0, props, gpu_id=0)


def _write_kfd_gpu_node(root: Path, node: int, card: AmdCard) -> None:
    domain, bus, dev, fn = _split_bdf(_bdf(card.bus_id))
    unique = int(card.unique_id, 16) if card.unique_id else 0
    props = {
        "cpu_cores_count": 0,
        "simd_count": card.simd_count,
        "mem_banks_count": 1,
        "simd_per_cu": card.simd_per_cu,
        "gfx_target_version": card.gfx_target_version,
        "vendor_id": AMD_VENDOR,
        "device_id": card.device_id,
        "location_id": bus << 8 | dev << 3 | fn,
        "domain": domain,
        "drm_render_minor": card.render_minor,
        "unique_id": unique,
        "num_xcc": 1,
    }
    _write_kfd_node(root, node, props, gpu_id=0x1000 + node)


def _write_kfd_node(root: Path, node: int, props: dict[str, int], *, gpu_id: int) -> None:
    base = root / _KFD_NODES / str(node)
    _write(base / "properties", "".join(f"{k} {v}\n" for k, v in props.items()))
    _write(base / "gpu_id", f"{gpu_id}\n")


def _amdgpu_ids(cards: list[AmdCard]) -> str:
    """libdrm's table, one ``DEVICE,\\tREV,\\tname`` line per distinct card type."""
    lines: list[str] = []
    for card in cards:
        line = f"{card.device_id:04X},\t{card.revision:02X},\t{card.name}\n"
        if line not in lines:
            lines.append(line)
    return _AMDGPU_IDS_HEADER + "".join(lines)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _symlink(root: Path, link: str, target: str) -> None:
    """Make ``root/link`` point at ``root/target`` with a relative path, as the kernel does."""
    _place_link(root / link, os.path.relpath(target, os.path.dirname(link)))


def _place_link(link_path: Path, relative: str) -> None:
    link_path.parent.mkdir(parents=True, exist_ok=True)
    if link_path.is_symlink():
        if os.readlink(link_path) == relative:
            return
        link_path.unlink()
    os.symlink(relative, link_path)

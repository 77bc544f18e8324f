"""The simulated tree must look like the kernel's to the real readers (pci, HostFS)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from agent.devices import pci
from agent.devices.simulation import profiles, sysfs
from agent.errors import ProfileError


def _nvidia_card(
    bus_id: str, bridges: tuple[str, ...] = (), **extra: object
) -> profiles.NvidiaCard:
    return profiles.NvidiaCard(
        uuid=f"GPU-{bus_id}",
        name="NVIDIA H200",
        bus_id=bus_id,
        bridges=bridges,
        memory_total_mib=143771,
        compute_capability=(9, 0),
        **extra,  # type: ignore[arg-type]
    )


def _amd_card(bus_id: str, card: int, render: int, **extra: object) -> profiles.AmdCard:
    fields: dict[str, object] = {
        "unique_id": "00000000000000ab",
        "name": "AMD Instinct MI300X",
        "bus_id": bus_id,
        "device_id": 0x74A1,
        "revision": 0x00,
        "card": card,
        "render_minor": render,
        "vram_total_bytes": 206141652992,
        "simd_count": 1216,
        "gfx_target_version": 90402,
    }
    fields.update(extra)
    return profiles.AmdCard(**fields)  # type: ignore[arg-type]


def _profile(
    nvidia: tuple[profiles.NvidiaCard, ...] = (), amd: tuple[profiles.AmdCard, ...] = ()
) -> profiles.Profile:
    return profiles.Profile(
        description="test",
        kernel_release="6.8.0-test",
        nvidia=profiles.NvidiaHost(driver_version="570.1", cuda_driver_version=12080, cards=nvidia)
        if nvidia
        else None,
        amd=profiles.AmdHost(module_version="6.10.5", rocm_version="6.4.1", cards=amd)
        if amd
        else None,
    )


def test_pci_links_are_relative_and_bridges_resolve(tmp_path: Path) -> None:
    bridges = ("0000:15:01.0", "0000:16:00.0", "0000:17:00.0")
    host = sysfs.materialize(_profile(nvidia=(_nvidia_card("0000:18:00.0", bridges),)), tmp_path)

    link = tmp_path / "sys/bus/pci/devices/0000:18:00.0"
    target = os.readlink(link)
    assert target == (
        "../../../devices/pci0000:00/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
    )
    assert pci.bridges_of(host, "0000:18:00.0") == bridges
    assert host.read_text("/sys/bus/pci/devices/0000:16:00.0/class") == "0x060400"


def test_nvidia_functions_are_found_by_the_pci_check(tmp_path: Path) -> None:
    cards = (
        _nvidia_card("0000:b8:00.0", numa_node=1, cpu_list="56-111"),
        _nvidia_card("0000:18:00.0", ("0000:15:01.0",)),
    )
    host = sysfs.materialize(_profile(nvidia=cards), tmp_path)

    found = pci.scan(host, 0x10DE)

    assert [f.bdf for f in found] == ["0000:18:00.0", "0000:b8:00.0"]
    assert found[0].pci_class == 0x030200
    assert found[0].device == 0x2335
    assert found[0].numa_node is None  # written as -1
    assert found[0].cpu_list is None  # written empty
    assert found[0].bridges == ("0000:15:01.0",)
    assert (found[1].numa_node, found[1].cpu_list) == (1, "56-111")
    assert pci.scan(host, 0x1002) == []
    assert host.read_text("/proc/sys/kernel/osrelease") == "6.8.0-test"


def test_amd_card_gets_amdgpu_drm_kfd_and_host_files(tmp_path: Path) -> None:
    card = _amd_card("0000:0c:00.0", 8, 136, edge_temperature_mc=41000, power_average_uw=140000000)
    host = sysfs.materialize(_profile(amd=(card,)), tmp_path)
    base = "/sys/bus/pci/devices/0000:0c:00.0"

    (function,) = pci.scan(host, 0x1002)
    assert (function.device, function.revision, function.pci_class) == (0x74A1, 0, 0x030000)
    assert host.read_text(f"{base}/unique_id") == "00000000000000ab"
    assert host.read_int(f"{base}/mem_info_vram_total") == 206141652992
    assert host.list_dir(f"{base}/drm") == ["card8", "renderD136"]
    assert os.readlink(tmp_path / "sys/class/drm/card8/device") == "../../../0000:0c:00.0"
    driver = os.path.realpath(tmp_path / "sys/bus/pci/devices/0000:0c:00.0/driver")
    assert driver == str(tmp_path.resolve() / "sys/bus/pci/drivers/amdgpu")
    assert host.read_text(f"{base}/hwmon/hwmon0/temp1_label") == "edge"
    assert host.read_int(f"{base}/hwmon/hwmon0/power1_average") == 140000000
    nodes = "/sys/class/kfd/kfd/topology/nodes"
    assert host.list_dir(nodes) == ["0", "1"]
    assert "simd_count 0" in (host.read_text(f"{nodes}/0/properties") or "")
    props = dict(
        line.split() for line in (host.read_text(f"{nodes}/1/properties") or "").splitlines()
    )
    assert props["location_id"] == str(0x0C << 8)
    assert props["unique_id"] == str(0xAB)
    assert props["gfx_target_version"] == "90402"
    assert props["drm_render_minor"] == "136"
    assert host.read_text("/sys/module/amdgpu/version") == "6.10.5"
    assert host.read_text("/opt/rocm/.info/version") == "6.4.1"
    ids = host.read_text("/usr/share/libdrm/amdgpu.ids") or ""
    assert ids.startswith("# List of AMDGPU IDs")
    assert "74A1,\t00,\tAMD Instinct MI300X" in ids.splitlines()


def test_absent_amd_values_leave_files_out(tmp_path: Path) -> None:
    card = _amd_card("0000:03:00.0", 0, 128, unique_id=None, busy_percent=None)
    profile = msgspec.structs.replace(_profile(amd=(card,)), amd=profiles.AmdHost(cards=(card,)))
    host = sysfs.materialize(profile, tmp_path)

    base = "/sys/bus/pci/devices/0000:03:00.0"
    assert not host.exists(f"{base}/unique_id")
    assert not host.exists(f"{base}/gpu_busy_percent")
    assert not host.exists(f"{base}/hwmon/hwmon0/temp1_input")
    assert not host.exists("/sys/module/amdgpu/version")
    assert not host.exists("/opt/rocm/.info/version")


def test_builtin_profile_materializes_twice_identically(tmp_path: Path) -> None:
    profile = profiles.load("amd-rx7800xt-x2")
    sysfs.materialize(profile, tmp_path)
    first = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))

    host = sysfs.materialize(profile, tmp_path)

    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == first
    assert [f.bdf for f in pci.scan(host, 0x1002)] == ["0000:04:00.0", "0000:0c:00.0"]


@pytest.mark.parametrize(
    ("nvidia", "amd", "message"),
    [
        ((_nvidia_card("0000:18:00.0"), _nvidia_card("0000:18:00.0")), (), "0000:18:00.0"),
        ((_nvidia_card("0000:18:00.0"),), (_amd_card("0000:18:00.0", 0, 128),), "0000:18:00.0"),
        ((), (_amd_card("0000:03:00.0", 1, 128), _amd_card("0000:04:00.0", 1, 129)), "card1"),
        ((), (_amd_card("0000:03:00.0", 0, 128), _amd_card("0000:04:00.0", 1, 128)), "renderD128"),
        (
            (
                _nvidia_card("0000:18:00.0", ("0000:15:01.0",)),
                _nvidia_card("0000:19:00.0", ("0000:14:00.0", "0000:15:01.0")),
            ),
            (),
            "0000:15:01.0",
        ),
        ((_nvidia_card("18:00.0"),), (), "18:00.0"),
    ],
    ids=[
        "same-bus",
        "same-bus-across-vendors",
        "same-card",
        "same-render",
        "bridge-moved",
        "bad-bdf",
    ],
)
def test_inconsistent_profiles_are_rejected(
    tmp_path: Path,
    nvidia: tuple[profiles.NvidiaCard, ...],
    amd: tuple[profiles.AmdCard, ...],
    message: str,
) -> None:
    with pytest.raises(ProfileError, match=message):
        sysfs.materialize(_profile(nvidia=nvidia, amd=amd), tmp_path)
    assert not (tmp_path / "sys").exists()


# -- library-read manufacturers ----------------------------------------------------------------

_CHIP = """
description: x
ascend:
  chips:
    - {busId: "0000:81:00.0", pciDeviceId: 0xd500, cardId: 4, logicId: 0, physicalId: 0,
       chipName: 310P3, aicoreCount: 8, dieId: [1, 2, 3, 4, 5], memoryTotalMib: 1,
       temperatureC: 1, powerDeciwatts: 1}
    - {busId: "0000:81:00.0", pciDeviceId: 0xd500, cardId: 4, deviceId: 1, logicId: 1,
       physicalId: 1, chipName: 310P3, aicoreCount: 8, dieId: [1, 2, 3, 4, 6],
       memoryTotalMib: 1, temperatureC: 1, powerDeciwatts: 1, numaNode: NUMA}
"""


def test_chips_of_one_card_share_one_pci_function(tmp_path: Path) -> None:
    profile = msgspec.yaml.decode(_CHIP.replace("NUMA", "null").encode(), type=profiles.Profile)
    host = sysfs.materialize(profile, tmp_path)
    (function,) = pci.scan(host, 0x19E5)
    assert (function.bdf, function.pci_class) == ("0000:81:00.0", 0x120000)


def test_chips_sharing_an_address_must_agree_on_the_function(tmp_path: Path) -> None:
    profile = msgspec.yaml.decode(_CHIP.replace("NUMA", "1").encode(), type=profiles.Profile)
    with pytest.raises(ProfileError, match="0000:81:00.0 disagree"):
        sysfs.materialize(profile, tmp_path)


def test_library_cards_with_drm_nodes_must_not_share_numbers(tmp_path: Path) -> None:
    profile = profiles.load("metax-c500-x8")
    assert profile.metax is not None
    cards = list(profile.metax.cards)
    cards[1] = msgspec.structs.replace(cards[1], card=cards[0].card)
    broken = msgspec.structs.replace(
        profile, metax=msgspec.structs.replace(profile.metax, cards=tuple(cards))
    )
    with pytest.raises(ProfileError, match="card number card1 is used by two cards"):
        sysfs.materialize(broken, tmp_path)


@pytest.mark.parametrize("name", profiles.packaged_names())
def test_every_packaged_profile_lays_out_its_cards(name: str, tmp_path: Path) -> None:
    profile = profiles.load(name)
    host = sysfs.materialize(profile, tmp_path)
    for key, cards in profile.library_cards().items():
        vendor = {"ascend": 0x19E5, "cambricon": 0xCABC, "hygon": 0x1D94, "iluvatar": 0x1E3E,
                  "metax": 0x9999, "mthreads": 0x1ED5, "thead": 0x1DED}[key]  # fmt: skip
        assert len(pci.scan(host, vendor)) == len({c.bus_id for c in cards})

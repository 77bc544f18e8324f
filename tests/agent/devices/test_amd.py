"""AMD detection from sysfs: the seed's examples, then each field's source and fallback.

Except for the seed tests (which run the packaged profile through the simulator), every tree is
written by hand here, so a mistake in the simulator cannot hide the same mistake in the backend.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
import pytest

from agent.devices import amdgpu_ids
from agent.devices.amd import AmdBackend
from agent.devices.hostfs import HostFS
from agent.devices.simulation import profiles, sysfs
from agent.errors import DetectionError, HostReadError

MI300X_KFD = {"simd_count": 1216, "simd_per_cu": 4, "gfx_target_version": 90402}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _add_card(
    root: Path,
    bdf: str,
    *,
    card: int | None = 0,
    render: int | None = 128,
    unique_id: str | None = "00000000000000a1",
    device: int = 0x74A1,
    revision: int = 0,
    pci_class: int = 0x038000,
    vendor: int = 0x1002,
    bridges: tuple[str, ...] = (),
    driver: str | None = "amdgpu",
    attrs: dict[str, str] | None = None,
    hwmon: dict[str, str] | None = None,
) -> Path:
    """Write one PCI function the way the kernel lays it out, returning its directory."""
    rel = "/".join(("sys/devices/pci0000:00", *bridges, bdf))
    base = root / rel
    values = {
        "vendor": f"0x{vendor:04x}",
        "device": f"0x{device:04x}",
        "class": f"0x{pci_class:06x}",
        "revision": f"0x{revision:02x}",
        "subsystem_vendor": "0x1002",
        "subsystem_device": "0x0e3c",
        "numa_node": "-1",
        "local_cpulist": "0-7",
        "mem_info_vram_total": str(192 << 30),
        **({"unique_id": unique_id} if unique_id is not None else {}),
        **(attrs or {}),
    }
    for name, value in values.items():
        _write(base / name, value)
    for name, value in (hwmon or {}).items():
        _write(base / "hwmon/hwmon3" / name, value)
    for node in ([f"card{card}"] if card is not None else []) + (
        [f"renderD{render}"] if render is not None else []
    ):
        (base / "drm" / node).mkdir(parents=True)
        os.symlink(f"../../../{bdf}", base / "drm" / node / "device")
        (root / "sys/class/drm").mkdir(parents=True, exist_ok=True)
        os.symlink(
            os.path.relpath(base / "drm" / node, root / "sys/class/drm"),
            root / "sys/class/drm" / node,
        )
    if driver is not None:
        (root / "sys/bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(root / "sys/bus/pci/drivers" / driver, base), base / "driver")
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    os.symlink(
        os.path.relpath(base, root / "sys/bus/pci/devices"), root / "sys/bus/pci/devices" / bdf
    )
    return base


def _add_kfd(root: Path, node: int, props: dict[str, int]) -> None:
    _write(
        root / f"sys/class/kfd/kfd/topology/nodes/{node}/properties",
        "\n".join(f"{k} {v}" for k, v in props.items()),
    )


def _kfd_for(bdf: str, **props: int) -> dict[str, int]:
    domain, bus, rest = bdf.split(":")
    dev, fn = rest.split(".")
    location = int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn, 16)
    return {**MI300X_KFD, "domain": int(domain, 16), "location_id": location, **props}


def _detect_one(root: Path, **kwargs: bool) -> dict[str, object]:
    groups = AmdBackend(host=HostFS(root), **kwargs).detect()
    assert len(groups) == 1
    result = _wire(groups[0])
    assert isinstance(result, dict)
    return result


def _wire(value: object) -> object:
    """What the value looks like once encoded (lists, camelCase, absent fields left out)."""
    return msgspec.json.decode(msgspec.json.encode(value))


def _accelerators(group: dict[str, object]) -> list[dict[str, object]]:
    accelerators = group["accelerators"]
    assert isinstance(accelerators, list)
    return accelerators


def _accelerator(group: dict[str, object], n: int = 0) -> dict[str, object]:
    return _accelerators(group)[n]


# -- the seed's examples -----------------------------------------------------------------------


@pytest.fixture
def rx7800xt(tmp_path: Path) -> HostFS:
    return sysfs.materialize(profiles.load("amd-rx7800xt-x2"), tmp_path)


def test_seed_detect_example(rx7800xt: HostFS) -> None:
    (group,) = AmdBackend(host=rx7800xt, simulated=True).detect()

    seen = _wire(msgspec.structs.replace(group, accelerators=group.accelerators[:1]))
    assert seen == {
        "id": "radeon-rx-7800-xt",
        "manufacturer": "amd",
        "name": "AMD Radeon RX 7800 XT",
        "memory": 16368,
        "cores": 60,
        "driverVersion": "6.16.13",
        "runtimeVersion": "7.2",
        "computeCapability": "gfx1101",
        "family": "GC 11.0.0",
        "simulated": True,
        "accelerators": [
            {
                "id": "GPU-5c88007d760374f3",
                "index": 0,
                "physicalIndexes": [1, 128],
                "topology": {
                    "pciBusId": "0000:04:00.0",
                    "numaAffinity": "0",
                    "cpuAffinity": "0-13",
                },
                "status": {
                    "unhealthy": False,
                    "logicalSliced": {"coresPercentageOvercommit": True, "count": 128},
                },
            }
        ],
    }
    assert [a.index for a in group.accelerators] == [0, 1]
    assert group.accelerators[1].physical_indexes == (2, 129)


def test_seed_monitor_example(rx7800xt: HostFS) -> None:
    samples = AmdBackend(host=rx7800xt, simulated=True).sample()

    assert _wire(samples[0]) == {
        "id": "GPU-5c88007d760374f3",
        "memory": 16368,
        "memoryUsage": 174,
        "memoryUtilization": 1,
        "coresUtilization": 0,
        "temperature": 44,
        "powerUsage": 8,
        "unhealthy": False,
    }
    assert len(samples) == 2


# -- enumeration -------------------------------------------------------------------------------


def test_no_amd_function_means_no_groups(tmp_path: Path) -> None:
    _add_card(tmp_path, "0000:18:00.0", vendor=0x10DE, pci_class=0x030200, driver="nvidia")

    assert AmdBackend(host=HostFS(tmp_path)).detect() == []
    assert AmdBackend(host=HostFS(tmp_path)).sample() == []
    assert AmdBackend(host=HostFS(tmp_path), pci_check=False).detect() == []


def test_pci_accelerators_without_amdgpu_are_a_detection_error(tmp_path: Path) -> None:
    _add_card(tmp_path, "0000:03:00.0", card=None, render=None, driver="vfio-pci")
    _add_card(tmp_path, "0000:83:00.0", driver="radeon")

    with pytest.raises(DetectionError, match="2 AMD PCI accelerators found but none is driven"):
        AmdBackend(host=HostFS(tmp_path)).detect()


def test_unbound_card_is_skipped_and_keeps_others_ordered_by_address(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _add_card(tmp_path, "0000:83:00.0", card=0, render=128, unique_id="00000000000000b2")
    _add_card(tmp_path, "0000:03:00.0", card=8, render=136, unique_id="00000000000000b1")
    _add_card(tmp_path, "0000:43:00.0", card=None, render=None, driver=None)
    # The HDMI audio function shares the vendor and has no DRM node; the class filter drops it.
    _add_card(tmp_path, "0000:03:00.1", card=None, render=None, pci_class=0x040300)

    with caplog.at_level(logging.WARNING):
        group = _detect_one(tmp_path)

    ids = [(a["id"], a["index"], a["physicalIndexes"]) for a in _accelerators(group)]
    assert ids == [("GPU-00000000000000b1", 0, [8, 136]), ("GPU-00000000000000b2", 1, [0, 128])]
    assert "0000:43:00.0 is not driven by amdgpu" in caplog.text
    assert "0000:03:00.1" not in caplog.text


def test_without_pci_check_cards_come_from_class_drm(tmp_path: Path) -> None:
    _add_card(tmp_path, "0000:c3:00.0", card=1, render=129, unique_id="00000000000000c3")
    _add_card(tmp_path, "0000:01:00.0", vendor=0x10DE, card=0, render=128, driver="nouveau")
    # Connectors and a directory that only looks like a card are not devices.
    (tmp_path / "sys/class/drm/card1-DP-1").mkdir()
    (tmp_path / "sys/class/drm/version").write_text("drm 1.1.0\n")

    group = _detect_one(tmp_path, pci_check=False)

    assert [a["id"] for a in group["accelerators"]] == ["GPU-00000000000000c3"]  # type: ignore[attr-defined]
    assert _accelerator(group)["physicalIndexes"] == [1, 129]


def test_unreadable_attribute_is_a_detection_error_naming_the_path(tmp_path: Path) -> None:
    base = _add_card(tmp_path, "0000:03:00.0")
    (base / "mem_info_vram_total").unlink()
    (base / "mem_info_vram_total").mkdir()  # reading it fails with EISDIR, as an I/O error would

    with pytest.raises(DetectionError, match="mem_info_vram_total") as info:
        AmdBackend(host=HostFS(tmp_path)).detect()
    assert isinstance(info.value.__cause__, HostReadError)


def test_unreadable_pci_directory_is_a_detection_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _add_card(tmp_path, "0000:03:00.0")

    def refuse(self: HostFS, host_path: str) -> str | None:
        raise HostReadError(f"cannot read {self.path(host_path)}: Permission denied")

    monkeypatch.setattr(HostFS, "read_text", refuse)
    with pytest.raises(DetectionError, match="amd: cannot read .*/sys/bus/pci/devices/"):
        AmdBackend(host=HostFS(tmp_path)).sample()


def test_every_read_stays_under_the_host_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "host"
    _add_card(root, "0000:03:00.0")
    _add_kfd(root, 1, _kfd_for("0000:03:00.0"))
    _write(root / "proc/sys/kernel/osrelease", "6.8.0-rel")
    mapped: list[Path] = []
    original = HostFS.path

    def spy(self: HostFS, host_path: str) -> Path:
        mapped.append(original(self, host_path))
        return mapped[-1]

    monkeypatch.setattr(HostFS, "path", spy)
    group = _detect_one(root)

    assert group["driverVersion"] == "6.8.0-rel"
    assert group["cores"] == 304
    assert mapped and all(p.is_relative_to(root) for p in mapped)


# -- one field at a time -----------------------------------------------------------------------


def test_unique_id_falls_back_to_kfd_and_a_card_without_one_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _add_card(tmp_path, "0000:03:00.0", card=0, render=128, unique_id=None)
    _add_card(tmp_path, "0000:23:00.0", card=1, render=129, unique_id="0000000000000000")
    _add_card(tmp_path, "0000:43:00.0", card=2, render=130, unique_id="00C0FFEE00C0FFEE")
    _add_kfd(tmp_path, 0, {"cpu_cores_count": 8, "simd_count": 0})
    _add_kfd(tmp_path, 1, _kfd_for("0000:03:00.0", unique_id=0x1234ABCD))
    _add_kfd(tmp_path, 2, _kfd_for("0000:23:00.0", unique_id=0))

    with caplog.at_level(logging.WARNING):
        group = _detect_one(tmp_path)

    pairs = [(a["id"], a["index"]) for a in _accelerators(group)]
    assert pairs == [("GPU-000000001234abcd", 0), ("GPU-00c0ffee00c0ffee", 2)]
    assert "0000:23:00.0 has no unique id" in caplog.text
    sampled = AmdBackend(host=HostFS(tmp_path)).sample()
    assert [s.id for s in sampled] == ["GPU-000000001234abcd", "GPU-00c0ffee00c0ffee"]


def test_name_prefers_amdgpu_ids_then_pci_ids_subsystem_then_chip_then_generic(
    tmp_path: Path,
) -> None:
    _add_card(tmp_path, "0000:03:00.0", device=0x747E, revision=0xC8)
    backend = AmdBackend(host=HostFS(tmp_path))
    pci_ids = (
        "# pci.ids\n10de  NVIDIA Corporation\n\t747e  Not AMD\n"
        "1002  Advanced Micro Devices, Inc. [AMD/ATI]\n"
        "\t7470  Other\n\t\t1002 0e3c  Wrong chip\n"
        "\t747e  Navi 32 [Radeon RX 7700 XT / 7800 XT]\n"
        "\t\t1002 0e3d  Radeon RX 7700 XT\n"
        "\t\t1002 0e3c  Radeon RX 7800 XT\n"
        "\t7480  Navi 33\n1022  AMD\n"
    )

    assert _detect_one(tmp_path)["name"] == "AMD GPU 747e"

    _write(tmp_path / "usr/share/misc/pci.ids", pci_ids.replace("0e3c  Radeon", "0e3f  Radeon"))
    assert _detect_one(tmp_path)["name"] == "AMD Navi 32 [Radeon RX 7700 XT / 7800 XT]"

    _write(tmp_path / "usr/share/hwdata/pci.ids", pci_ids)
    assert _detect_one(tmp_path)["name"] == "AMD Radeon RX 7800 XT"

    ids = "# List of AMDGPU IDs\n#\n\n1.0.0\n747E,\tC0,\tAMD Radeon Other\n747E,\tC8,\tAMD Radeon RX 7800 XT (opt)\n"
    _write(tmp_path / "opt/amdgpu/share/libdrm/amdgpu.ids", ids)
    assert backend.detect()[0].name == "AMD Radeon RX 7800 XT (opt)"

    _write(tmp_path / "usr/share/libdrm/amdgpu.ids", ids.replace(" (opt)", ""))
    (group,) = backend.detect()
    assert (group.id, group.name) == ("radeon-rx-7800-xt", "AMD Radeon RX 7800 XT")


def test_versions_prefer_the_module_and_take_major_minor_of_rocm(tmp_path: Path) -> None:
    _add_card(tmp_path, "0000:03:00.0")
    _write(tmp_path / "proc/sys/kernel/osrelease", "6.16.13")
    group = _detect_one(tmp_path)
    assert group["driverVersion"] == "6.16.13"
    assert "runtimeVersion" not in group

    _write(tmp_path / "sys/module/amdgpu/version", "6.12.12")
    _write(tmp_path / "opt/rocm/.info/version", "7.2.0-43")
    group = _detect_one(tmp_path)
    assert (group["driverVersion"], group["runtimeVersion"]) == ("6.12.12", "7.2")


def test_kfd_gives_cores_target_and_family_matched_by_location_then_render(
    tmp_path: Path,
) -> None:
    _add_card(tmp_path, "0001:03:00.0", card=0, render=128, unique_id="00000000000000a1")
    _add_card(
        tmp_path, "0000:83:00.0", card=1, render=129, unique_id="00000000000000a2", device=0x740F
    )
    # Same location as the first card but another domain: must not be taken for it.
    _add_kfd(tmp_path, 1, _kfd_for("0000:03:00.0", simd_count=8, drm_render_minor=200))
    _add_kfd(tmp_path, 2, _kfd_for("0001:03:00.0", drm_render_minor=128))
    _add_kfd(
        tmp_path,
        3,
        {"simd_count": 440, "simd_per_cu": 2, "gfx_target_version": 90010, "drm_render_minor": 129},
    )

    groups = AmdBackend(host=HostFS(tmp_path)).detect()

    seen = {a.id: (g.cores, g.compute_capability, g.family) for g in groups for a in g.accelerators}
    assert seen == {
        "GPU-00000000000000a1": (304, "gfx942", "AI"),
        "GPU-00000000000000a2": (220, "gfx90a", "AI"),
    }


def test_optional_attributes_absent_leave_fields_out(tmp_path: Path) -> None:
    base = _add_card(tmp_path, "0000:03:00.0", render=None)
    (base / "mem_info_vram_total").unlink()

    group = _detect_one(tmp_path)
    (sample,) = AmdBackend(host=HostFS(tmp_path)).sample()

    for absent in ("memory", "cores", "computeCapability", "family", "driverVersion"):
        assert absent not in group
    assert _accelerator(group)["physicalIndexes"] == [0]
    assert _accelerator(group)["topology"] == {"pciBusId": "0000:03:00.0", "cpuAffinity": "0-7"}
    assert _wire(sample) == {"id": "GPU-00000000000000a1", "unhealthy": False}


def test_bridges_become_root_and_switches(tmp_path: Path) -> None:
    bridges = ("0000:00:01.1", "0000:01:00.0", "0000:02:00.0")
    _add_card(tmp_path, "0000:03:00.0", bridges=bridges, attrs={"numa_node": "1"})

    topology = _accelerator(_detect_one(tmp_path))["topology"]

    assert topology == {
        "pciBusId": "0000:03:00.0",
        "pciRootId": "0000:00:01.1",
        "pciSwitches": ["0000:02:00.0", "0000:01:00.0", "0000:00:01.1"],
        "numaAffinity": "1",
        "cpuAffinity": "0-7",
    }


def test_sample_reads_edge_sensor_and_falls_back_to_power_input(tmp_path: Path) -> None:
    hwmon = {
        "temp1_input": "61000",
        "temp1_label": "junction",
        "temp2_input": "52499",
        "temp2_label": "edge",
        "temp3_input": "70000",
        "temp3_label": "mem",
        "power1_input": "301500000",
    }
    attrs = {"mem_info_vram_used": str(96 << 30), "gpu_busy_percent": "37"}
    _add_card(tmp_path, "0000:03:00.0", attrs=attrs, hwmon=hwmon)

    (sample,) = AmdBackend(host=HostFS(tmp_path)).sample()

    assert (sample.memory, sample.memory_usage, sample.memory_utilization) == (196608, 98304, 50)
    assert (sample.cores_utilization, sample.temperature, sample.power_usage) == (37, 52, 302)


def test_sample_without_labels_uses_temp1_and_prefers_power_average(tmp_path: Path) -> None:
    hwmon = {
        "temp1_input": "44500",
        "temp2_input": "90000",
        "power1_average": "8400000",
        "power1_input": "99000000",
    }
    _add_card(tmp_path, "0000:03:00.0", hwmon=hwmon)

    (sample,) = AmdBackend(host=HostFS(tmp_path)).sample()

    assert (sample.temperature, sample.power_usage) == (45, 8)


def test_same_product_with_different_memory_gets_sized_group_ids(tmp_path: Path) -> None:
    _add_card(tmp_path, "0000:03:00.0", unique_id="00000000000000a1")
    _add_card(
        tmp_path,
        "0000:23:00.0",
        card=1,
        render=129,
        unique_id="00000000000000a2",
        attrs={"mem_info_vram_total": str(256 << 30)},
    )
    _add_card(tmp_path, "0000:43:00.0", card=2, render=130, unique_id="00000000000000a3")

    groups = AmdBackend(host=HostFS(tmp_path)).detect()

    assert [(g.id, g.memory, [a.index for a in g.accelerators]) for g in groups] == [
        ("gpu-74a1-192g", 196608, [0, 2]),
        ("gpu-74a1-256g", 262144, [1]),
    ]


# -- the tables --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "name", "family"),
    [
        (110001, "gfx1101", "GC 11.0.0"),  # RX 7800 XT (Navi 32, GC 11.0.3)
        (110000, "gfx1100", "GC 11.0.0"),
        (110003, "gfx1103", "GC 11.0.1"),  # Phoenix APU
        (110501, "gfx1151", "GC 11.5.0"),  # Strix Halo APU
        (120001, "gfx1201", "GC 12.0.0"),
        (90402, "gfx942", "AI"),
        (90010, "gfx90a", "AI"),
        (90008, "gfx908", "AI"),
        (90012, "gfx90c", "RV"),  # Renoir APU
        (100300, "gfx1030", "NV"),
        (100305, "gfx1035", "YC"),  # Rembrandt APU
        (80003, "gfx803", "VI"),
        (130000, "gfx1300", None),
    ],
)
def test_gfx_name_and_family(version: int, name: str, family: str | None) -> None:
    assert amdgpu_ids.gfx_name(version) == name
    assert amdgpu_ids.family_name(version) == family

"""Ascend through simulated DCMI: values, units (0.1 W, MB), duo cards, MCU units, CANN."""

from __future__ import annotations

from pathlib import Path

import pytest
from vendor_helpers import accelerators, rig, validate_devices, wire

from agent.devices import ascend
from agent.devices.libs import clib
from agent.devices.simulation.fakedcmi import SimulatedDcmi

DUO_AND_MCU = """
description: one 310P3 duo card (two chips on one PCI function) and an A3-style MCU unit
ascend:
  driverVersion: "23.0.rc3.3"
  cannVersion: "8.2.RC1"
  mcuCards: [4]
  chips:
    - &chip
      busId: "0000:81:00.0"
      pciDeviceId: 0xd500
      cardId: 4
      deviceId: 0
      logicId: 0
      physicalId: 0
      chipName: "310P3"
      aicoreCount: 8
      dieId: [1, 2, 3, 4, 5]
      hbm: false
      memoryTotalMib: 44280
      memoryUsedMib: 1380
      aicoreUtilization: 55
      temperatureC: 47
      powerDeciwatts: 719
    - <<: *chip
      deviceId: 1
      logicId: 1
      physicalId: 1
      dieId: [1, 2, 3, 4, 6]
      memoryTotalMib: 43693
"""


def test_the_910b2_node_reads_as_captured(tmp_path: Path) -> None:
    groups = rig("ascend", "ascend-910b2x8", tmp_path).backend.detect()
    (group,) = wire(groups)
    first = group.pop("accelerators")[0]
    assert group == {
        "id": "910b2",
        "manufacturer": "ascend",
        "name": "910B2",
        "memory": 65536,
        "cores": 24,
        "driverVersion": "25.5.1",
        "runtimeVersion": "8.5",  # CANN 8.5.0's version.info
        "family": "910B",
        "simulated": True,
    }
    assert first == {
        "id": "NPU-e0f4ee64-802061b1-6a691492-89528485-104301e3",
        "index": 0,
        "physicalIndexes": [0, 0, 0],
        "topology": {"pciBusId": "0000:c1:00.0", "numaAffinity": "6"},
        "status": {
            "unhealthy": False,
            "logicalSliced": {"coresPercentageOvercommit": True, "count": 63},
        },
    }


def test_power_is_read_in_tenths_of_a_watt(tmp_path: Path) -> None:
    samples = wire(rig("ascend", "ascend-910b2x8", tmp_path).backend.sample())
    assert samples[0] == {
        "id": "NPU-e0f4ee64-802061b1-6a691492-89528485-104301e3",
        "memory": 65536,
        "memoryUsage": 3432,
        "memoryUtilization": 5,
        "coresUtilization": 0,
        "temperature": 47,
        "powerUsage": 101,  # 1013 tenths: 101.3 W, truncated
        "unhealthy": False,
    }
    assert [s["powerUsage"] for s in samples] == [101, 101, 96, 97, 95, 102, 102, 99]


def test_a_duo_card_gives_two_chips_and_its_mcu_is_skipped(tmp_path: Path) -> None:
    r = rig("ascend", DUO_AND_MCU, tmp_path)
    groups = r.backend.detect()
    validate_devices(groups)
    (group,) = wire(groups)
    assert group["name"] == "310P3" and group["family"] == "310P" and group["memory"] == 43693
    assert group["runtimeVersion"] == "8.2" and group["driverVersion"] == "23.0.rc3.3"
    found = group["accelerators"]
    assert [a["physicalIndexes"] for a in found] == [[0, 4, 0], [1, 4, 1]]
    assert {a["topology"]["pciBusId"] for a in found} == {"0000:81:00.0"}
    assert ("dcmi_get_device_type", None) in r.library.calls  # the MCU was asked and skipped
    assert not any(c == ("dcmi_get_device_die_v2", None) for c in r.library.calls)


def test_ddr_memory_comes_from_memory_info_v3(tmp_path: Path) -> None:
    """The HBM call answers size 0 on DDR chips."""
    r = rig("ascend", DUO_AND_MCU, tmp_path)
    samples = wire(r.backend.sample())
    assert [(s["memory"], s["memoryUsage"]) for s in samples] == [(44280, 1380), (43693, 1380)]
    assert [s["coresUtilization"] for s in samples] == [55, 55]
    assert ("dcmi_get_device_memory_info_v3", 0) in r.library.calls


A5_V2_ONLY = """
description: two Ascend 950 chips behind a V2-only driver (dcmi_init refused)
ascend:
  api: 2
  chips:
    - &chip
      busId: "0000:41:00.0"
      pciDeviceId: 0xd806
      cardId: 0
      logicId: 0
      physicalId: 8
      chipName: "Ascend950PR"
      aicoreCount: 32
      dieId: [10, 20, 30, 40, 50]
      memoryTotalMib: 131072
      memoryUsedMib: 2048
      aicoreUtilization: 12
      temperatureC: 45
      powerDeciwatts: 2505
    - <<: *chip
      busId: "0000:42:00.0"
      cardId: 1
      logicId: 1
      physicalId: 9
      dieId: [10, 20, 30, 40, 51]
"""


def test_a_v2_only_driver_is_read_through_the_dcmiv2_calls(tmp_path: Path) -> None:
    """As gpustack-runtime's ``AscendDetector.is_supported`` and the reference's DCMI binding:
    when ``dcmi_init`` is refused, ``dcmiv2_init`` and the ``dcmiv2_*`` calls by device id."""
    r = rig("ascend", A5_V2_ONLY, tmp_path)
    groups = r.backend.detect()
    validate_devices(groups)
    (group,) = wire(groups)
    assert group["family"] == "950" and group["cores"] == 32 and "driverVersion" not in group
    found = group["accelerators"]
    assert [a["physicalIndexes"] for a in found] == [[8, 0, 0], [9, 1, 0]]
    assert [a["topology"]["pciBusId"] for a in found] == ["0000:41:00.0", "0000:42:00.0"]
    samples = wire(r.backend.sample())
    assert [(s["memory"], s["powerUsage"], s["coresUtilization"]) for s in samples] == [
        (131072, 250, 12), (131072, 250, 12),
    ]  # fmt: skip
    assert ("dcmi_init", None) in r.library.calls and ("dcmiv2_init", None) in r.library.calls


def test_a_v2_only_driver_has_no_share_flag_to_turn_on(tmp_path: Path) -> None:
    """The reference's DCMI binding: V2 declares no container-share entry point, so there is no
    flag (not a flag that is off); the share step changes nothing and fails nothing."""
    r = rig("ascend", A5_V2_ONLY, tmp_path)
    reader = r.backend.reader()
    assert isinstance(reader, ascend.AscendReader)
    assert reader.share_container(9) is False
    assert not [c for c in r.library.calls if "share" in c[0] or "phyid" in c[0]]


@pytest.mark.parametrize(
    ("chip", "family"),
    [("910B2", "910B"), ("310P3", "310P"), ("910", "910"), ("910_9391", "910C"),
     ("Ascend950PR", "950"), ("310B1", "310B"), ("weird", None)],
)  # fmt: skip
def test_family_from_the_chip_name(chip: str, family: str | None) -> None:
    assert ascend.family(chip) == family


def test_the_id_is_the_die_id_zero_padded() -> None:
    assert ascend.uuid((0x7281A664, 0xC0C977, 1, 2, 3)) == (
        "NPU-7281a664-00c0c977-00000001-00000002-00000003"
    )


def test_no_driver_version_call_leaves_the_field_out(tmp_path: Path) -> None:
    r = rig("ascend", "ascend-910b2x8", tmp_path)
    r.library.host = r.library.host.__class__(chips=r.library.host.chips)
    (group,) = wire(r.backend.detect())
    assert "driverVersion" not in group
    assert group["runtimeVersion"] == "8.5"  # the toolkit's file, not a DCMI call
    assert len(accelerators(r.backend.detect())) == 8


def test_share_container_turns_on_only_the_chip_with_that_physical_id(tmp_path: Path) -> None:
    r = rig("ascend", DUO_AND_MCU, tmp_path)
    reader = r.backend.reader()
    assert isinstance(reader, ascend.AscendReader)
    library = r.library
    assert isinstance(library, SimulatedDcmi)

    # Physical id 1 is the duo card's second chip: (card 4, device 1), found through DCMI.
    reader.dcmi.init()
    assert reader.dcmi.card_device_of(1) == (4, 1)
    assert reader.share_container(1) is True
    assert library.shared == [False, True]
    assert reader.dcmi.share_enabled(4, 1) and not reader.dcmi.share_enabled(4, 0)
    assert reader.share_container(1) is False  # already on: asked, not set again
    assert [n for n, _ in library.calls].count("dcmi_set_device_share_enable") == 1


def test_share_container_maps_driver_refusals_to_library_errors(tmp_path: Path) -> None:
    r = rig("ascend", DUO_AND_MCU, tmp_path)
    reader = r.backend.reader()
    assert isinstance(reader, ascend.AscendReader)
    library = r.library
    assert isinstance(library, SimulatedDcmi)
    library.faults[0]["dcmi_set_device_share_enable"] = -8002

    with pytest.raises(clib.LibError) as unknown:
        reader.share_container(9)
    with pytest.raises(clib.LibError) as refused:
        reader.share_container(0)

    assert unknown.value.code_name == "INVALID_DEVICE_ID"
    assert refused.value.code_name == "OPER_NOT_PERMITTED"
    assert library.shared == [False, False]

"""Hygon through simulated DTK ROCm SMI plus KFD and sysfs: units, ids, CUs, versions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from vendor_helpers import rig, validate_devices, wire

from agent.devices.libs import rocmsmi


def test_the_k100_ai_node_reads_as_captured(tmp_path: Path) -> None:
    (group,) = wire(rig("hygon", "hygon-k100-ai-x8", tmp_path).backend.detect())
    found = group.pop("accelerators")
    assert group == {
        "id": "k100-ai",
        "manufacturer": "hygon",
        "name": "K100_AI",
        "memory": 65520,
        "cores": 120,
        "runtimeVersion": "24.04",
        "computeCapability": "gfx928",
        "simulated": True,
    }  # no driverVersion: the hycu module publishes none on that host
    assert found[0]["id"] == "GPU-7100f95cee823041"
    assert [a["physicalIndexes"] for a in found] == [[i + 1, 128 + i] for i in range(8)]
    assert found[0]["topology"]["pciBusId"] == "0000:07:00.0"


def test_three_scalings_are_converted(tmp_path: Path) -> None:
    samples = wire(rig("hygon", "hygon-k100-ai-x8", tmp_path).backend.sample())
    assert samples[2] == {
        "id": "GPU-7151b6f7e44e2041",
        "memory": 65520,
        "memoryUsage": 2,
        "memoryUtilization": 0,
        "coresUtilization": 0,
        "temperature": 63,  # 63250 m°C, whole degrees as gpustack-runtime's pyrocmsmi (// 1000)
        "powerUsage": 106,  # 106300000 µW
        "unhealthy": False,
    }


@pytest.mark.parametrize(
    ("packed", "bdf"),
    [(0x1D00, "0000:1d:00.0"), (1 << 32 | 0xC1 << 8 | 3 << 3 | 1, "0001:c1:03.1"),
     (0xF << 28 | 0x9C00, "0000:9c:00.0")],
)  # fmt: skip
def test_the_packed_pci_id(packed: int, bdf: str) -> None:
    assert rocmsmi.decode_bdf(packed) == bdf


def test_a_leading_zero_unique_id_is_written_as_gpustack_runtime_writes_it(
    tmp_path: Path,
) -> None:
    """Oracle: gpustack-runtime 0.2.6 ``detector/hygon.py`` writes ``GPU-`` + ``hex(id)[2:]``."""
    text = Path(__file__).parent.parent.parent.parent / "agent/devices/simulation/builtin"
    yaml = (
        (text / "hygon-k100-ai-x8.yaml")
        .read_text()
        .replace("0x7100f95cee823041", "0x0000f95cee823041", 1)
    )
    found = wire(rig("hygon", yaml, tmp_path).backend.detect())[0]["accelerators"]
    assert found[0]["id"] == "GPU-" + hex(0x0000F95CEE823041)[2:] == "GPU-f95cee823041"


def _with_mig(mode: bool) -> str:
    text = Path(__file__).parent.parent.parent.parent / "agent/devices/simulation/builtin"
    yaml = (text / "hygon-k100-ai-x8.yaml").read_text()
    yaml = yaml.replace(
        '  dtkVersion: "24.04.3"\n',
        f'  dtkVersion: "24.04.3"\n  migLibrary: true\n  migMode: {str(mode).lower()}\n',
    )
    profiles = (
        "      migProfiles:\n"
        "        - {name: 1g.16gb, memoryMib: 16380, sliceCount: 1, instanceCount: 4, cuCount: 30}\n"
        "        - {name: 2g.32gb, memoryMib: 32760, sliceCount: 2, instanceCount: 2, cuCount: 60}\n"
        "        - {name: 'bad name', memoryMib: 65520, sliceCount: 4, instanceCount: 1}\n"
    )
    return yaml.replace(
        "      gfxTargetVersion: 90208\n", "      gfxTargetVersion: 90208\n" + profiles
    )


def test_dcus_in_mig_mode_offer_their_partitions(tmp_path: Path) -> None:
    groups = rig("hygon", _with_mig(True), tmp_path).backend.detect()
    validate_devices(groups)
    status = wire(groups)[0]["accelerators"][0]["status"]
    assert "logicalSliced" not in status
    assert status["physicalSliced"] == {
        "profiles": [
            {"name": "1g.16gb", "memoryMib": 16380, "computeSlices": 1, "memorySlices": 1,
             "count": 4},
            {"name": "2g.32gb", "memoryMib": 32760, "computeSlices": 2, "memorySlices": 2,
             "count": 2},
            {"name": "4g.63gb", "memoryMib": 65520, "computeSlices": 4, "memorySlices": 4,
             "count": 1},
        ],
        "count": 4,
    }  # fmt: skip


@pytest.mark.parametrize("gap", [2, 3, 6])
def test_a_profile_gap_answered_any_routine_way_keeps_the_other_profiles(
    tmp_path: Path, gap: int
) -> None:
    """No 3-slice profile: INVALID_ARGUMENT (2), NOT_SUPPORTED (3) and NOT_FOUND (6) are all
    routine answers for it (gpustack-runtime's ``pydmi``); none may empty the partition set."""
    yaml = _with_mig(True).replace("  migMode: true\n", f"  migMode: true\n  migGapCode: {gap}\n")
    status = wire(rig("hygon", yaml, tmp_path).backend.detect())[0]["accelerators"][0]["status"]
    assert [p["computeSlices"] for p in status["physicalSliced"]["profiles"]] == [1, 2, 4]


def test_a_profile_query_failing_otherwise_is_not_taken_for_a_gap(tmp_path: Path) -> None:
    yaml = _with_mig(True).replace("  migMode: true\n", "  migMode: true\n  migGapCode: 999\n")
    status = wire(rig("hygon", yaml, tmp_path).backend.detect())[0]["accelerators"][0]["status"]
    assert not status.get("physicalSliced", {}).get("profiles")  # UNKNOWN: logged, left out


def test_power_drawn_is_rsmi_dev_power_get_and_the_average_only_without_it(
    tmp_path: Path,
) -> None:
    """gpustack-runtime reads ``rsmi_dev_power_get`` (µW) and falls back to the average."""
    text = Path(__file__).parent.parent.parent.parent / "agent/devices/simulation/builtin"
    yaml = (text / "hygon-k100-ai-x8.yaml").read_text()
    current = yaml.replace("      powerUw: 104300000\n", "      powerUw: 250900000\n", 1)
    samples = wire(rig("hygon", current, tmp_path / "current").backend.sample())
    assert samples[0]["powerUsage"] == 250  # the current reading, not the 102 W average
    without = re.sub(r"      powerUw: \d+\n", "", yaml)  # an older DTK refusing the call
    older = rig("hygon", without, tmp_path / "older")
    assert wire(older.backend.sample())[0]["powerUsage"] == 102  # the average
    assert ("rsmi_dev_power_ave_get", 0) in older.library.calls


def test_mig_off_or_no_mig_library_means_software_slices(tmp_path: Path) -> None:
    off = rig("hygon", _with_mig(False), tmp_path / "off")
    status = wire(off.backend.detect())[0]["accelerators"][0]["status"]
    assert status["logicalSliced"] == {"coresPercentageOvercommit": False, "count": 4}
    assert off.library.companion is not None
    assert off.library.companion.calls == [("nvmlGetSystemMigMode", None)]
    plain = rig("hygon", "hygon-k100-ai-x8", tmp_path / "plain")
    assert "logicalSliced" in wire(plain.backend.detect())[0]["accelerators"][0]["status"]

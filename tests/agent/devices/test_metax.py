"""MetaX through simulated MXSML: KB, °C × 100, summed supply ways, DRM numbers, MACA."""

from __future__ import annotations

from pathlib import Path

from vendor_helpers import rig, wire


def test_the_c500_node_reads_as_captured(tmp_path: Path) -> None:
    (group,) = wire(rig("metax", "metax-c500-x8", tmp_path).backend.detect())
    found = group.pop("accelerators")
    assert group == {
        "id": "mxc500",
        "manufacturer": "metax",
        "name": "MXC500",
        "memory": 65536,  # 67108864 KB
        "driverVersion": "3.6.11",
        "runtimeVersion": "3.5",
        "family": "MXC",  # the product line as the product is named: MXC500
        "simulated": True,
    }
    assert [a["physicalIndexes"] for a in found] == [[i + 1, 128 + i] for i in range(8)]
    assert found[0]["id"] == "GPU-3fd4ee8f-169c-6d31-f9dc-c2a90a441f1b"


def test_units_are_converted_once(tmp_path: Path) -> None:
    samples = wire(rig("metax", "metax-c500-x8", tmp_path).backend.sample())
    assert samples[2] == {
        "id": "GPU-83be6bc6-a0c4-12f9-ddb2-a5fae06c2603",
        "memory": 65536,  # 67108864 KB
        "memoryUsage": 826,  # 845824 KB
        "memoryUtilization": 1,
        "coresUtilization": 0,
        "temperature": 38,  # 3812 hundredths, truncated
        "powerUsage": 57,  # 28700 + 28700 mW over two supply ways
        "unhealthy": False,
    }


def test_board_power_is_negotiated_in_two_calls(tmp_path: Path) -> None:
    r = rig("metax", "metax-c500-x8", tmp_path)
    r.backend.sample()
    power_calls = [c for c in r.library.calls if c == ("mxSmlGetBoardPowerInfo", 0)]
    assert len(power_calls) == 2

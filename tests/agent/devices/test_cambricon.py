"""Cambricon through simulated CNDev: stamped structures, bare UUIDs, names, Neuware, units."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from vendor_helpers import load, rig, wire

from agent.devices.libs import clib, cndev


def test_the_mlu370_node_reads_as_configured(tmp_path: Path) -> None:
    (group,) = wire(rig("cambricon", "cambricon-mlu370-x8-x4", tmp_path).backend.detect())
    found = group.pop("accelerators")
    assert group == {
        "id": "mlu370-x8",
        "manufacturer": "cambricon",
        "name": "MLU370-X8",
        "memory": 49152,
        "driverVersion": "4.20.16",
        "runtimeVersion": "3.0",
        "simulated": True,
    }
    assert found[0]["id"] == "MLU-20a1b3c4-d5e6-4f70-8192-a3b4c5d6e7f0"  # NUL stripped
    assert [a["physicalIndexes"] for a in found] == [[0], [1], [2], [3]]


def test_usage_is_in_mib_watts_and_the_chip_sensor(tmp_path: Path) -> None:
    samples = wire(rig("cambricon", "cambricon-mlu370-x8-x4", tmp_path).backend.sample())
    assert samples[2] == {
        "id": "MLU-20a1b3c4-d5e6-4f70-8192-a3b4c5d6e7f2",
        "memory": 49152,
        "memoryUsage": 30720,
        "memoryUtilization": 63,
        "coresUtilization": 78,
        "temperature": 61,
        "powerUsage": 203,
        "unhealthy": False,
    }


def test_an_older_driver_is_named_from_the_enum(tmp_path: Path) -> None:
    profile = load("cambricon-mlu370-x8-x4")
    assert profile.cambricon is not None
    older = profile.cambricon.__class__(
        neuware_version=None, name_strings=False, cards=profile.cambricon.cards
    )
    r = rig("cambricon", profile.__class__(description="old", cambricon=older), tmp_path)
    (group,) = wire(r.backend.detect())
    assert group["name"] == "MLU370" and "runtimeVersion" not in group


def test_an_unstamped_structure_is_refused_as_the_real_library_does(tmp_path: Path) -> None:
    r = rig("cambricon", "cambricon-mlu370-x8-x4", tmp_path)
    binding = cndev.Cndev(r.library)
    binding.init()
    handle = binding.handle(0)
    raw = cndev.TemperatureInfo()  # version left 0
    assert r.library.cndevGetTemperatureInfo(ctypes.byref(raw), handle) == 3
    assert binding.temperature(handle) == 38
    with pytest.raises(clib.LibFailed):
        binding.handle(9)

"""Moore Threads through simulated MTML: mW, audio functions, every handle freed in order."""

from __future__ import annotations

from pathlib import Path

from vendor_helpers import rig, wire

from agent.devices import pci


def test_the_s4000_node_reads_as_configured(tmp_path: Path) -> None:
    r = rig("mthreads", "mthreads-s4000-x8", tmp_path)
    (group,) = wire(r.backend.detect())
    found = group.pop("accelerators")
    assert group == {
        "id": "mtt-s4000",
        "manufacturer": "mthreads",
        "name": "MTT S4000",
        "memory": 49152,
        "driverVersion": "2.7.0",
        "simulated": True,
    }
    assert [a["physicalIndexes"] for a in found] == [[i, 128 + i] for i in range(8)]


def test_the_audio_functions_share_the_vendor_id_but_are_not_cards(tmp_path: Path) -> None:
    r = rig("mthreads", "mthreads-s4000-x8", tmp_path)
    vendor_functions = [
        bdf for bdf in r.host.list_dir(pci.PCI_DEVICES)
        if r.host.read_int(f"{pci.PCI_DEVICES}/{bdf}/vendor") == 0x1ED5
    ]  # fmt: skip
    assert len(vendor_functions) == 16
    assert len(pci.scan(r.host, 0x1ED5)) == 8


def test_power_is_converted_from_milliwatts(tmp_path: Path) -> None:
    samples = wire(rig("mthreads", "mthreads-s4000-x8", tmp_path).backend.sample())
    assert samples[2] == {
        "id": "b6e1a3f0-5c2d-4e7a-9f18-0c3d5e7a9b02",
        "memory": 49152,
        "memoryUsage": 36864,
        "memoryUtilization": 75,
        "coresUtilization": 97,
        "temperature": 66,
        "powerUsage": 341,  # 341870 mW, not 341870 W
        "unhealthy": False,
    }


def test_every_handle_is_freed_and_sub_handles_before_their_device(tmp_path: Path) -> None:
    r = rig("mthreads", "mthreads-s4000-x8", tmp_path)
    r.backend.detect()
    r.backend.sample()
    assert r.library.live == set()
    refused = [
        name for name, position in r.library.calls
        if position is None and "Free" not in name
        and name.startswith(("mtmlDevice", "mtmlMemory", "mtmlGpu"))
    ]  # fmt: skip
    assert refused == []  # no call was made on a handle already freed


def test_a_failed_uuid_read_frees_the_device_it_opened(tmp_path: Path) -> None:
    r = rig("mthreads", "mthreads-s4000-x8", tmp_path)
    r.library.faults[3]["mtmlDeviceGetUUID"] = 4
    assert len(r.backend.detect()[0].accelerators) == 7
    assert r.library.live == set()

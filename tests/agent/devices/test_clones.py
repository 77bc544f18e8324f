"""Iluvatar (IXML) and T-Head (HGML), the two NVML clones: values, units, nodes, partitions."""

from __future__ import annotations

from pathlib import Path

import pytest
from vendor_helpers import rig, validate_devices, wire

from agent.devices.libs import clib, hgml, ixml

THEAD_MIG = """
description: one PPU in MIG mode with two compute profiles and a copy-engine one (illustrative)
thead:
  driverVersion: "1.4.1-816bc0"
  runtimeVersion: 12030
  cards:
    - uuid: GPU-011ef111-8330-0426-0000-00006093bb5b
      name: PPU-ZW810E
      busId: "0000:05:00.0"
      pciDeviceId: 0x8810
      minor: 1
      memoryTotalMib: 97920
      temperatureC: 30
      powerMw: 58999
      migMode: true
      migProfiles:
        - {id: 0, sliceCount: 1, instanceCount: 8, memoryMib: 12240, placementSize: 1,
           placementStarts: [0, 1, 2, 3, 4, 5, 6, 7]}
        - {id: 3, sliceCount: 4, instanceCount: 2, memoryMib: 48960, placementSize: 4,
           placementStarts: [0, 4]}
        - {id: 10, sliceCount: 2, instanceCount: 4, memoryMib: 24480, placementSize: 2,
           placementStarts: [0, 2, 4, 6]}
        - {id: 1, sliceCount: 2, instanceCount: 4, memoryMib: 24480, placementSize: 2}
"""


def test_the_bi_v150s_reads_as_ixsmi_shows_it(tmp_path: Path) -> None:
    (group,) = wire(rig("iluvatar", "iluvatar-bi-v150s-x2", tmp_path).backend.detect())
    found = group.pop("accelerators")
    assert group == {
        "id": "iluvatar-bi-v150s",
        "manufacturer": "iluvatar",
        "name": "Iluvatar BI-V150S",
        "memory": 32768,
        "driverVersion": "4.1.0",
        "simulated": True,
    }
    assert [a["physicalIndexes"] for a in found] == [[0], [1]]  # /dev/iluvatar<minor>
    assert found[0]["topology"] == {"pciBusId": "0000:8a:00.0", "numaAffinity": "1"}


def test_an_unreadable_iluvatar_minor_number_falls_back_to_the_index(tmp_path: Path) -> None:
    """Oracle: gpustack-runtime 0.2.6 ``deployer/cdi/iluvatar.py`` uses the index then."""
    text = Path(__file__).parent.parent.parent.parent / "agent/devices/simulation/builtin"
    yaml = (text / "iluvatar-bi-v150s-x2.yaml").read_text()
    yaml = yaml.replace("      minor: 0\n", "").replace("      minor: 1\n", "")
    found = wire(rig("iluvatar", yaml, tmp_path).backend.detect())[0]["accelerators"]
    assert [a["physicalIndexes"] for a in found] == [[0], [1]]


def test_clone_units_are_nvmls(tmp_path: Path) -> None:
    samples = wire(rig("thead", "thead-ppu-zw810e-x16", tmp_path).backend.sample())
    assert samples[0] == {
        "id": "GPU-019e2226-4211-0208-0000-000000ab261d",
        "memory": 98304,
        "memoryUsage": 91349,  # bytes as HGML reports them, in MiB
        "memoryUtilization": 93,
        "coresUtilization": 0,
        "temperature": 34,
        "powerUsage": 93,  # 93120 mW
        "unhealthy": False,
    }
    assert {s["powerUsage"] for s in samples} == {62, 64, 91, 92, 93, 94, 95, 97}


def test_the_ppu_node_reads_as_captured(tmp_path: Path) -> None:
    (group,) = wire(rig("thead", "thead-ppu-zw810e-x16", tmp_path).backend.detect())
    found = group.pop("accelerators")
    assert group == {
        "id": "ppu-zw810e",
        "manufacturer": "thead",
        "name": "PPU-ZW810E",
        "memory": 98304,
        "cores": 16384,
        "driverVersion": "2.1.0-ra1f23041713",
        "computeCapability": "8.0",
        "simulated": True,
    }  # no runtimeVersion: that host's HGML reports no HGGC version
    # /dev/alixpu_ppu<ordinal>, although the minor numbers are one higher.
    assert [a["physicalIndexes"] for a in found] == [[i] for i in range(16)]
    assert [a["topology"]["numaAffinity"] for a in found[::4]] == ["4", "2", "6", "0"]
    (mig,) = wire(rig("thead", THEAD_MIG, tmp_path / "mig").backend.detect())
    assert mig["runtimeVersion"] == "12.3"  # HGGC 12030, CUDA-style


def test_a_ppu_in_mig_mode_offers_its_compute_partitions_only(tmp_path: Path) -> None:
    groups = rig("thead", THEAD_MIG, tmp_path).backend.detect()
    validate_devices(groups)
    (group,) = wire(groups)
    status = group["accelerators"][0]["status"]
    assert "logicalSliced" not in status
    assert status["physicalSliced"] == {
        "profiles": [
            {"name": "1g.11gb", "memoryMib": 12240, "computeSlices": 1, "memorySlices": 1,
             "count": 8},
            {"name": "4g.47gb", "memoryMib": 48960, "computeSlices": 4, "memorySlices": 4,
             "count": 2},
        ],
        "count": 8,
    }  # fmt: skip


def test_each_clone_calls_its_own_symbols(tmp_path: Path) -> None:
    """IXML answers nvml* names only and HGML hgml* names only: neither resolves the other's."""
    il = rig("iluvatar", "iluvatar-bi-v150s-x2", tmp_path / "i")
    th = rig("thead", "thead-ppu-zw810e-x16", tmp_path / "t")
    il.backend.detect()
    th.backend.detect()
    assert {c[0][:4] for c in il.library.calls} == {"nvml"}
    assert {c[0][:4] for c in th.library.calls} == {"hgml"}
    with pytest.raises(AttributeError):
        il.library.hgmlInitWithFlags  # noqa: B018
    with pytest.raises(clib.LibUnsupported):
        hgml.binding(il.library).init()
    binding = ixml.binding(il.library)
    binding.init()
    assert binding.device_count() == 2


def test_the_runtime_version_is_omitted_when_the_library_has_none(tmp_path: Path) -> None:
    (group,) = wire(rig("iluvatar", "iluvatar-bi-v150s-x2", tmp_path).backend.detect())
    assert "runtimeVersion" not in group and "computeCapability" not in group
    assert "cores" not in group

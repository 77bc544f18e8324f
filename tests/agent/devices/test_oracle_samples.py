"""The packaged ``--simulate`` profiles agree with gpustack-runtime's own captured samples.

Oracle: the ``detect_output_*.json`` samples of gpustack-runtime 0.2.6 (its sdist's
``tests/gpustack_runtime/detector/samples/``; samples/README.md says which were captured on real
hardware). ``oracle_samples.json`` holds the fields compared, extracted from those files, with
each file's sha256 to say which copy. For every device the sample reports, what our detector
reports for the simulated node must be what GPUStack's detector reported for the real one, in
our wire format: ids (as GPUStack writes them, Ascend's as docs/detection.md explains), names,
versions, cores, MiB, °C, W, PCI address, NUMA node and device-node numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vendor_helpers import rig, wire

SAMPLES = json.loads((Path(__file__).parent / "oracle_samples.json").read_text())["samples"]


def _ascend_id(uuid: str) -> str:
    return "NPU-" + "-".join(f"{int(w, 16):08x}" for w in uuid.split())


def _physical(profile: str, device: dict[str, Any]) -> list[int]:
    a = device["appendix"]
    if profile.startswith("ascend"):
        return [a["physical_id"], a["card_id"], a["device_id"]]
    if profile.startswith("thead"):
        return [a["minor_number"] - 1]  # /dev/alixpu_ppu<ordinal>; the minor is one higher
    return [a["card_id"], a["renderd_id"]]


def _brief(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


@pytest.mark.parametrize("profile", sorted(SAMPLES))
def test_the_profile_reads_as_gpustack_runtime_captured_it(profile: str, tmp_path: Path) -> None:
    r = rig(profile.split("-")[0], profile, tmp_path)
    (group,) = wire(r.backend.detect())
    samples = {s["id"]: s for s in wire(r.backend.sample())}
    found = group["accelerators"]
    devices = SAMPLES[profile]["devices"]
    assert len(found) == len(devices)
    for ours, theirs in zip(found, devices, strict=True):
        where = f"{profile} device {theirs['index']} vs {SAMPLES[profile]['file']}"
        uuid = theirs["uuid"]
        assert ours["id"] == (_ascend_id(uuid) if profile.startswith("ascend") else uuid), where
        assert ours["index"] == theirs["index"], where
        assert ours["physicalIndexes"] == _physical(profile, theirs), where
        assert ours["topology"]["pciBusId"] == theirs["appendix"]["bdf"], where
        assert ours["topology"]["numaAffinity"] == theirs["appendix"]["numa"], where
        assert group["name"] == theirs["name"], where
        assert group.get("driverVersion") == theirs["driver_version"], where
        assert group.get("runtimeVersion") == _brief(theirs["runtime_version"]), where
        assert group.get("cores") == theirs["cores"], where
        assert group.get("computeCapability") == theirs["compute_capability"], where
        usage = samples[ours["id"]]
        assert usage["memory"] == theirs["memory"], where
        assert usage["memoryUsage"] == theirs["memory_used"], where
        assert usage["temperature"] == theirs["temperature"], where
        assert usage["powerUsage"] == int(theirs["power_used"]), where  # W, whole
        assert usage["coresUtilization"] == theirs["cores_utilization"], where


def test_every_packaged_profile_with_an_oracle_sample_is_checked() -> None:
    builtin = Path(__file__).parents[3] / "agent/devices/simulation/builtin"
    citing = sorted(p.stem for p in builtin.glob("*.yaml") if "detector/samples/" in p.read_text())
    assert citing == sorted(SAMPLES)

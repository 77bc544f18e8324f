"""The DCGM exporter's default fields NVML gives, sampled through the adapter from the
simulated NVML: each present where the card reports it, absent (never 0) where it does not."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nvidia_helpers import rig

from agent.serve import metrics
from bus import devices

_UUID = "GPU-6f1c2b9e-3a47-5d81-9c0e-1b2a3c4d5e6"


def _samples(r: Any) -> list[dict[str, Any]]:
    return msgspec.json.decode(msgspec.json.encode(r.backend.sample()))


def test_a_card_without_a_field_leaves_it_out_and_counts_no_error(tmp_path: Path) -> None:
    faults = {"nvmlDeviceGetRemappedRows": "NOT_SUPPORTED", "nvmlDeviceGetNvLinkState": "NOT_SUPPORTED",
              "nvmlDeviceGetClockInfo": "NOT_SUPPORTED"}  # fmt: skip
    r = rig(tmp_path, faults={2: faults})
    samples = _samples(r)
    assert samples[2]["id"] == _UUID + "2"
    absent = {"remappedRowsCorrectable", "remappedRowsUncorrectable", "rowRemapFailed",
              "nvlinkLinks", "nvlinkTx", "nvlinkRx", "smClock", "memoryClock"}  # fmt: skip
    assert absent.isdisjoint(samples[2]) and absent <= set(samples[1])
    assert samples[2]["energy"] > 0 and samples[2]["pcieTxThroughput"] == 1200
    assert r.nvml.errors_by_call == {}  # "not supported" is not an error


def test_a_failing_call_is_counted_logged_and_drops_only_its_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(tmp_path, faults={5: {"nvmlDeviceGetFieldValues": "UNKNOWN"}})
    with caplog.at_level(logging.WARNING):
        samples = _samples(r)
    assert samples[5]["nvlinkLinks"] == 18
    # Both readings made through field values are left out, the rest of the card is there.
    assert {"nvlinkTx", "nvlinkRx", "memoryTemperature"}.isdisjoint(samples[5])
    assert samples[5]["smClock"] == 1980 and samples[4]["memoryTemperature"] == 38
    assert r.nvml.errors_by_call["nvmlDeviceGetFieldValues"] == 2  # two calls, both failed
    assert "card 5" in caplog.text


def test_cards_before_row_remapping_report_retired_pages(tmp_path: Path) -> None:
    r = rig(tmp_path)
    cards = list(r.sim.cards)
    cards[0] = msgspec.structs.replace(cards[0], remapped_rows=None, retired_pages=(3, 1))
    r.sim.cards = tuple(cards)
    first = _samples(r)[0]
    assert (first["retiredPagesSingleBit"], first["retiredPagesDoubleBit"]) == (3, 1)
    assert "remappedRowsCorrectable" not in first
    assert "retiredPagesSingleBit" not in _samples(r)[1]  # Hopper: row remapping instead


def test_mig_instances_are_sampled_with_their_profile_and_memory(tmp_path: Path) -> None:
    r = rig(tmp_path, "nvidia-h100x8-mig")
    r.backend.detect()  # learns which cards are in MIG mode, and their profiles
    assert _samples(r)[0]["migInstances"] == []  # MIG on, nothing carved yet
    with r.nvml.session():
        handle = r.nvml.handle(0)
        gi = r.nvml.create_gpu_instance(handle, 0, 0, 1)  # 1g.10gb at slice 0
        r.nvml.create_compute_instance(gi.handle, 1)
    (instance,) = _samples(r)[0]["migInstances"]
    assert instance["uuid"].startswith("MIG-")
    assert (instance["gpuInstanceId"], instance["profile"]) == (gi.id, "1g.10gb")
    assert instance["memory"] == 9984 and instance["memoryUsage"] == 0
    assert "migInstances" not in _samples(r)[4]  # MIG off


def test_a_field_the_card_lacks_is_absent_and_not_an_error(tmp_path: Path) -> None:
    r = rig(tmp_path)
    cards = list(r.sim.cards)
    cards[1] = msgspec.structs.replace(cards[1], memory_temperature_c=None, nvlink_links=0)
    r.sim.cards = tuple(cards)
    second = _samples(r)[1]
    assert {"memoryTemperature", "nvlinkLinks", "nvlinkTx"}.isdisjoint(second)
    assert r.nvml.errors_by_call == {}


def test_a_mig_cards_instances_reach_the_metrics_with_their_ids(tmp_path: Path) -> None:
    """The MIG profile end to end, sampler to families: each instance its own memory series."""
    r = rig(tmp_path, "nvidia-h100x8-mig")
    groups = r.backend.detect()
    with r.nvml.session():
        gi = r.nvml.create_gpu_instance(r.nvml.handle(1), 1, 0, 2)  # 2g.20gb
        r.nvml.create_compute_instance(gi.handle, 2)
    sample = devices.MonitorSample(manufacturer="nvidia", timestamp="t",
                                   accelerators=tuple(r.backend.sample()))  # fmt: skip
    families = {f.name: f for f in metrics.accelerator_families("n", groups, [sample])}
    mig = [
        (s.labels["gpu"], s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"], s.value)
        for s in families["gpustack_accelerator_memory_total_mib"].samples
        if s.labels["GPU_I_ID"]
    ]
    assert mig == [("1", str(gi.id), "2g.20gb", 20096.0)]
    utilization = {
        s.labels["gpu"] for s in families["gpustack_accelerator_utilization_percent"].samples
    }
    assert utilization == {"4", "5", "6", "7"}  # NVML has none for a card in MIG mode

"""The simulated load pattern: seeded, deterministic at a given clock, moving, and in bounds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from agent.devices.libs import nvml
from agent.devices.libs.nvml import Nvml
from agent.devices.nvidia import NvidiaBackend
from agent.devices.simulation import profiles, sysfs
from agent.devices.simulation.fakenvml import SimulatedNvml
from agent.devices.simulation.load import LoadPattern, busy, reading
from agent.errors import ProfileError
from bus import devices

_T0 = 1_796_000_000.0  # a fixed instant (Dec 2026): the clock these tests inject
_CLI = (
    shutil.which("gpustack-operator", path=os.path.dirname(sys.executable)) or "gpustack-operator"
)
_KEY = "GPU-6f1c2b9e-3a47-5d81-9c0e-1b2a3c4d5e61"


def _host() -> profiles.NvidiaHost:
    host = profiles.load("nvidia-h200x8").nvidia
    assert host is not None and host.load is not None
    return host


def _pattern() -> LoadPattern:
    pattern = _host().load
    assert pattern is not None
    return pattern


def test_the_same_card_time_and_seed_read_the_same_and_the_figures_are_pinned() -> None:
    pattern = _pattern()
    first = reading(pattern, _KEY, _T0, level_percent=87, memory_mib=143771 - 528)
    assert first == reading(pattern, _KEY, _T0, level_percent=87, memory_mib=143771 - 528)
    # Pinned: a change of the pattern's formula shows here (update with care: demos rely on it).
    assert (first.utilization_percent, first.memory_used_mib) == (71, 86672)
    assert (first.temperature_c, first.power_mw) == (59, 490059)


def test_another_seed_or_card_moves_differently() -> None:
    pattern = _pattern()
    other = msgspec.structs.replace(pattern, seed=pattern.seed + 1)
    series = [busy(pattern, _KEY, _T0 + s, 0.5) for s in range(60)]
    assert series != [busy(other, _KEY, _T0 + s, 0.5) for s in range(60)]
    assert series != [busy(pattern, _KEY[:-1] + "2", _T0 + s, 0.5) for s in range(60)]


def test_readings_move_over_two_minutes_and_stay_in_the_pattern_and_bus_bounds() -> None:
    pattern = _pattern()
    got = [
        reading(pattern, _KEY, _T0 + s, level_percent=42, memory_mib=143243)
        for s in range(0, 1800, 3)
    ]
    utilization = [r.utilization_percent for r in got]
    assert len(set(utilization[:40])) >= 15  # two minutes: not a flat line
    assert max(utilization) - min(utilization) >= 40
    assert len({r.memory_used_mib for r in got[:40]}) >= 30
    for r in got:
        assert 0 <= r.utilization_percent <= 100
        assert r.temperature_c is not None and 31 <= r.temperature_c <= 72
        assert r.power_mw is not None and 76000 <= r.power_mw <= 690000
        assert 143243 * 8 // 100 <= r.memory_used_mib <= 143243 * 92 // 100


def test_an_unsupported_reading_stays_unsupported() -> None:
    r = reading(_pattern(), _KEY, _T0, level_percent=0, memory_mib=1024, temperature=False,
                power=False)  # fmt: skip
    assert (r.temperature_c, r.power_mw) == (None, None)


def _sample(sim: SimulatedNvml, tmp_path: Path) -> list[devices.AcceleratorSample]:
    profile = msgspec.structs.replace(profiles.load("nvidia-h200x8"), nvidia=sim.host)
    backend = NvidiaBackend(
        host=sysfs.materialize(profile, tmp_path), nvml=Nvml(sim), pci_check=True, simulated=True
    )
    return list(backend.sample())


def test_the_simulated_nvml_reads_the_pattern_at_its_clock(tmp_path: Path) -> None:
    now = [_T0]
    sim = SimulatedNvml(_host(), clock=lambda: now[0])
    first = _sample(sim, tmp_path / "a")
    card = _host().cards[1]
    want = reading(_pattern(), card.uuid, _T0, level_percent=87, memory_mib=143771 - 528)
    assert (first[1].cores_utilization, first[1].memory_usage) == (
        want.utilization_percent,
        want.memory_used_mib,
    )
    assert (first[1].temperature, first[1].power_usage) == (59, 490)  # °C, W (pinned above)
    now[0] += 37
    later = _sample(sim, tmp_path / "b")
    assert [s.cores_utilization for s in later] != [s.cores_utilization for s in first]
    assert [s.memory_usage for s in later] != [s.memory_usage for s in first]
    # Encoded with the bus's strict types, bounds included: every reading is a valid sample.
    wire = msgspec.json.encode(later)
    msgspec.json.decode(wire, type=list[devices.AcceleratorSample], strict=True)


def test_without_a_clock_the_profile_snapshot_is_read(tmp_path: Path) -> None:
    (_, second, *_) = _sample(SimulatedNvml(_host()), tmp_path)
    assert (second.cores_utilization, second.memory_usage, second.temperature) == (87, 71880, 58)


@pytest.mark.parametrize(
    ("load", "why"),
    [
        ("{periodS: 0}", "periodS"),
        ("{temperatureC: [80, 30]}", "temperature_c"),
        ("{memoryPercent: [5, 120]}", "memoryPercent"),
        ("{bogus: 1}", "bogus"),
    ],
)
def test_a_bad_load_section_is_a_profile_error(tmp_path: Path, load: str, why: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "description: x\nnvidia:\n  driverVersion: '1'\n  cudaDriverVersion: 12080\n"
        f"  load: {load}\n"
    )
    with pytest.raises(ProfileError, match=why):
        profiles.load(str(path))


def test_dm_monitor_simulate_stays_valid_and_inside_the_pattern() -> None:
    result = subprocess.run(
        [_CLI, "dm", "monitor", "-o", "json", "--simulate", "nvidia-h200x8"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (sample,) = msgspec.json.decode(result.stdout.encode(), type=list[devices.MonitorSample])
    assert len(sample.accelerators) == 8
    for card in json.loads(result.stdout)[0]["accelerators"]:
        assert 31 <= card["temperature"] <= 72 and 76 <= card["powerUsage"] <= 690
        assert 143243 * 8 // 100 <= card["memoryUsage"] <= 143243 * 92 // 100


def test_the_energy_counter_adds_the_power_drawn_at_each_read_and_never_goes_back() -> None:
    now = [_T0]
    sim = SimulatedNvml(_host(), clock=lambda: now[0])
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(1)
    start = _host().cards[1].energy_mj
    assert start is not None
    counts, draws = [], []
    for step in range(40):
        now[0] = _T0 + 7 * step
        draws.append(sim.nvmlDeviceGetPowerUsage(handle))
        counts.append(sim.nvmlDeviceGetTotalEnergyConsumption(handle))
    assert len(set(draws)) > 10  # the power moved ...
    assert counts == [start + sum(draws[: i + 1]) for i in range(40)]  # ... one second each read
    assert counts == sorted(counts)


def test_gpm_activity_follows_the_moving_utilization() -> None:
    """The agent reads GPM on Hopper too: its engine activity moves with the load, as NVML's
    utilization does, within the simulated -5..+5 points of wobble."""
    now = [_T0]
    adapter = Nvml(SimulatedNvml(_host(), clock=lambda: now[0]))
    with adapter.session():
        handle = adapter.handle(1)
        older, newer = adapter.gpm_sample_alloc(), adapter.gpm_sample_alloc()
        seen = []
        for step in range(6):
            now[0] = _T0 + 100 * step
            utilization = adapter.library.nvmlDeviceGetUtilizationRates(handle).gpu
            adapter.gpm_sample(handle, older)
            adapter.gpm_sample(handle, newer)
            activity = adapter.gpm_metrics(older, newer, (nvml.GPM_GRAPHICS_UTIL,))
            assert abs(activity[nvml.GPM_GRAPHICS_UTIL] - utilization) <= 5
            seen.append(utilization)
        assert max(seen) - min(seen) > 10  # it did move
        adapter.gpm_sample_free(older)
        adapter.gpm_sample_free(newer)

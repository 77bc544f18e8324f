"""The eight other manufacturers' simulated cards move like the NVIDIA ones: through the real
backends (the vendor libraries' simulators and AMD's sysfs), at an injected clock, reproducible
per seed, in the pattern's bounds and the bus's."""

from __future__ import annotations

import msgspec
import pytest

from agent.devices import sources
from agent.devices.settings import DetectSettings
from agent.devices.simulation import moving, profiles
from agent.devices.simulation.load import reading
from bus import devices

_T0 = 1_796_000_000.0
VENDORS = {
    "amd": "amd-rx7800xt-x2",
    "ascend": "ascend-910b2x8",
    "cambricon": "cambricon-mlu370-x8-x4",
    "hygon": "hygon-k100-ai-x8",
    "iluvatar": "iluvatar-bi-v150s-x2",
    "metax": "metax-c500-x8",
    "mthreads": "mthreads-s4000-x8",
    "thead": "thead-ppu-zw810e-x16",
}


def _samples(key: str, t: float, profile: str | None = None) -> list[devices.AcceleratorSample]:
    settings = DetectSettings(simulate=profile or VENDORS[key], manufacturers=(key,))
    with sources.open_backends(settings, clock=lambda: t) as backends:
        return [s for b in backends for s in b.sample()]


def _figures(samples: list[devices.AcceleratorSample]) -> list[tuple[object, ...]]:
    return [
        (s.id, s.cores_utilization, s.memory_usage, s.temperature, s.power_usage) for s in samples
    ]


def _pattern(key: str) -> tuple[profiles.Profile, object]:
    profile = profiles.load(VENDORS[key])
    section = getattr(profile, key)
    assert section is not None and section.load is not None
    return profile, section.load


@pytest.mark.parametrize("key", sorted(VENDORS))
def test_usage_moves_with_the_clock_and_repeats_at_the_same_time(key: str) -> None:
    first = _samples(key, _T0)
    assert first and _figures(first) == _figures(_samples(key, _T0))  # reproducible
    later = [_figures(_samples(key, _T0 + s)) for s in (37, 151, 299)]
    utilization = {f[1] for run in later for f in run} | {f[1] for f in _figures(first)}
    memory = {f[2] for run in later for f in run} | {f[2] for f in _figures(first)}
    assert len(utilization) >= 4 and len(memory) >= 4, (utilization, memory)
    # Every sample still encodes under the bus's strict types and bounds.
    wire = msgspec.json.encode(first)
    msgspec.json.decode(wire, type=list[devices.AcceleratorSample], strict=True)


@pytest.mark.parametrize("key", sorted(VENDORS))
def test_temperature_and_power_follow_the_pattern_bounds(key: str) -> None:
    _, pattern = _pattern(key)
    low_c, high_c = pattern.temperature_c  # type: ignore[attr-defined]
    low_mw, high_mw = pattern.power_mw  # type: ignore[attr-defined]
    temperatures, powers = set(), set()
    for s in range(0, 600, 20):
        for sample in _samples(key, _T0 + s):
            assert 0 <= (sample.cores_utilization or 0) <= 100
            if sample.temperature is not None:
                assert low_c - 1 <= sample.temperature <= high_c + 1
                temperatures.add(sample.temperature)
            if sample.power_usage is not None:  # watts
                assert low_mw / 1000 - 1 <= sample.power_usage <= high_mw / 1000 + 1
                powers.add(sample.power_usage)
    assert len(temperatures) >= 4
    if key != "iluvatar":  # the BI-V150S reports no power ("N/A"): it stays unsupported
        assert len(powers) >= 4
    else:
        assert not powers


def test_the_figures_are_the_pattern_in_each_vendors_unit() -> None:
    profile, pattern = _pattern("ascend")
    assert profile.ascend is not None
    chip = profile.ascend.chips[0]
    motion = moving.MOTIONS["ascend"]
    want = reading(pattern, motion.key(chip), _T0, level_percent=chip.aicore_utilization,  # type: ignore[arg-type]
                   memory_mib=chip.memory_total_mib)  # fmt: skip
    got = moving.moved(motion, pattern, chip, _T0)  # type: ignore[arg-type]
    assert got.temperature_c == want.temperature_c
    assert got.power_deciwatts == round((want.power_mw or 0) / 100)
    assert (got.card_id, got.logic_id, got.die_id) == (chip.card_id, chip.logic_id, chip.die_id)
    sample = _samples("ascend", _T0)[0]
    assert (sample.cores_utilization, sample.memory_usage) == (
        want.utilization_percent, want.memory_used_mib
    )  # fmt: skip


def test_metax_power_keeps_the_split_over_its_supply_ways() -> None:
    profile, pattern = _pattern("metax")
    assert profile.metax is not None
    card = profile.metax.cards[0]
    got = moving.moved(moving.MOTIONS["metax"], pattern, card, _T0)  # type: ignore[arg-type]
    assert len(got.board_ways_mw) == len(card.board_ways_mw)
    share = card.board_ways_mw[0] / sum(card.board_ways_mw)
    assert abs(got.board_ways_mw[0] / sum(got.board_ways_mw) - share) < 0.01


def test_another_seed_moves_differently(tmp_path: object) -> None:
    profile = profiles.load(VENDORS["cambricon"])
    assert profile.cambricon is not None and profile.cambricon.load is not None
    other = msgspec.structs.replace(
        profile.cambricon, load=msgspec.structs.replace(profile.cambricon.load, seed=99)
    )
    card = profile.cambricon.cards[0]
    motion = moving.MOTIONS["cambricon"]
    series = [moving.moved(motion, profile.cambricon.load, card, _T0 + s) for s in range(30)]
    assert series != [moving.moved(motion, other.load, card, _T0 + s) for s in range(30)]  # type: ignore[arg-type]


def test_without_a_pattern_the_snapshot_is_read() -> None:
    profile = profiles.load(VENDORS["mthreads"])
    section = profile.mthreads
    assert section is not None
    still = msgspec.structs.replace(section, load=None)
    assert moving.moving("mthreads", still, lambda: _T0) is still
    assert moving.moving("mthreads", section, None) is section

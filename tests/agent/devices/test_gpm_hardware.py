"""GPM on a real card, where this runs on one (skipped elsewhere): the assumptions
agent/devices/gpm.py makes about NVML, checked against the driver rather than the simulator.

- two samples taken in *separate* NVML sessions (each monitor pass opens its own) still make a
  rate, and every figure is a ratio 0-1;
- on a card in MIG mode, each GPU instance is sampled on its own;
- closing frees every buffer without an error counted.
"""

from __future__ import annotations

import time

import pytest

from agent.devices.gpm import MIN_INTERVAL_S, GpmSampler
from agent.devices.libs.nvml import Nvml, NvmlError


def _gpm_cards(adapter: Nvml) -> list[tuple[int, str]]:
    try:
        with adapter.session():
            cards = [(i, adapter.uuid(adapter.handle(i))) for i in range(adapter.device_count())]
            return [(i, u) for i, u in cards if adapter.gpm_supported(adapter.handle(i))]
    except (ImportError, NvmlError):
        return []


@pytest.fixture
def adapter() -> Nvml:
    pytest.importorskip("pynvml")
    adapter = Nvml()
    if not _gpm_cards(adapter):
        pytest.skip("no NVIDIA card with GPM (Hopper or later) here")
    return adapter


def _pass(sampler: GpmSampler, cards: list[tuple[int, str]]) -> list[float | None]:
    """One monitor pass's GPM part, in a session of its own."""
    figures: list[float | None] = []
    with sampler.nvml.session():
        for index, uuid in cards:
            handle = sampler.nvml.handle(index)
            if sampler.nvml.mig_mode(handle):
                for mig in sampler.nvml.mig_devices(handle):
                    got = sampler.instance(handle, uuid, mig.gpu_instance_id, None)
                    figures.append(got.gr_engine_active if got else None)
                continue
            card = sampler.card(handle, uuid)
            figures.append(card.gr_engine_active if card else None)
        sampler.prune()
    return figures


def test_two_passes_in_separate_sessions_make_ratios(adapter: Nvml) -> None:
    cards = _gpm_cards(adapter)
    sampler = GpmSampler(adapter)
    first = _pass(sampler, cards)
    assert all(f is None for f in first)  # one sample is not a rate
    time.sleep(MIN_INTERVAL_S * 3)  # NVML refreshes GPM counters every 100 ms
    second = _pass(sampler, cards)
    assert len(second) == len(first) and all(f is not None and 0 <= f <= 1 for f in second), second
    with adapter.session():
        sampler.close()
    assert sampler.held() == 0
    assert adapter.errors_by_call == {}

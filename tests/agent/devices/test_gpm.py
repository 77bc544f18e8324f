"""GPM activity (the DCGM profiling fields NVML gives) through the adapter, the sampler and the
backend, against the simulated NVML: two samples make a rate, one makes nothing, a card without
GPM yields no series and no error, and no sample buffer outlives its card, instance or backend."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nvidia_helpers import Rig, rig

from agent import oneshots
from agent.devices import gpm
from agent.devices.gpm import Activity, GpmSampler
from agent.devices.libs import nvml
from agent.devices.libs.nvml import Nvml, NvmlCallFailed
from agent.devices.settings import DetectSettings
from agent.devices.simulation import profiles
from agent.devices.simulation.fakenvml import NVMLError, SimulatedNvml
from agent.serve import metrics
from bus import devices

_ALL = (nvml.GPM_GRAPHICS_UTIL, nvml.GPM_SM_UTIL, nvml.GPM_SM_OCCUPANCY, nvml.GPM_DRAM_BW_UTIL,
        nvml.GPM_ANY_TENSOR_UTIL)  # fmt: skip


def _sim(name: str = "nvidia-h200x8", **card_changes: object) -> SimulatedNvml:
    host = profiles.load(name).nvidia
    assert host is not None
    cards = tuple(msgspec.structs.replace(c, **card_changes) for c in host.cards)
    return SimulatedNvml(msgspec.structs.replace(host, cards=cards))


def _mig_rig(tmp_path: Path, **kwargs: Any) -> Rig:
    """The MIG profile, detected, with one GPU instance carved on each MIG card (0-3)."""
    r = rig(tmp_path, "nvidia-h100x8-mig", **kwargs)
    r.backend.gpm.min_interval_s = 0  # passes follow each other at once here
    r.backend.detect()
    with r.nvml.session():
        for index, (profile, start, size, slices) in enumerate(
            [(0, 0, 1, 1), (1, 2, 2, 2), (2, 4, 4, 3), (4, 0, 8, 7)]
        ):
            gi = r.nvml.create_gpu_instance(r.nvml.handle(index), profile, start, size)
            r.nvml.create_compute_instance(gi.handle, slices)
    return r


def _wire(samples: list[devices.AcceleratorSample]) -> list[dict[str, Any]]:
    return msgspec.json.decode(msgspec.json.encode(samples))


# -- the adapter --------------------------------------------------------------------------------


def test_two_samples_of_a_card_make_its_activity() -> None:
    adapter = Nvml(_sim())
    with adapter.session():
        handle = adapter.handle(1)  # utilizationPercent 87
        assert adapter.gpm_supported(handle)
        older, newer = adapter.gpm_sample_alloc(), adapter.gpm_sample_alloc()
        adapter.gpm_sample(handle, older)
        adapter.gpm_sample(handle, newer)
        got = adapter.gpm_metrics(older, newer, _ALL)
        # The simulated engine moves -5..+5 points around the profile's 87 %; the other
        # metrics are fixed shares of it.
        assert 82 <= got[nvml.GPM_GRAPHICS_UTIL] <= 92
        assert got[nvml.GPM_SM_UTIL] == pytest.approx(0.8 * got[nvml.GPM_GRAPHICS_UTIL])
        assert got[nvml.GPM_DRAM_BW_UTIL] == pytest.approx(0.6 * got[nvml.GPM_GRAPHICS_UTIL])
        assert got[nvml.GPM_ANY_TENSOR_UTIL] == pytest.approx(0.45 * got[nvml.GPM_GRAPHICS_UTIL])
        # One more sample into the older buffer: the next interval has a different figure.
        adapter.gpm_sample(handle, older)
        later = adapter.gpm_metrics(newer, older, _ALL)
        assert later[nvml.GPM_GRAPHICS_UTIL] != got[nvml.GPM_GRAPHICS_UTIL]
        adapter.gpm_sample_free(older)
        adapter.gpm_sample_free(newer)
    assert adapter.errors_by_call == {}


def test_samples_out_of_order_or_of_two_cards_are_refused() -> None:
    sim = _sim()
    adapter = Nvml(sim)
    with adapter.session():
        a, b, c = (adapter.gpm_sample_alloc() for _ in range(3))
        adapter.gpm_sample(adapter.handle(0), a)
        adapter.gpm_sample(adapter.handle(0), b)
        adapter.gpm_sample(adapter.handle(1), c)
        with pytest.raises(NvmlCallFailed, match="INVALID_ARGUMENT"):
            adapter.gpm_metrics(b, a, _ALL)  # newer first
        with pytest.raises(NvmlCallFailed, match="INVALID_ARGUMENT"):
            adapter.gpm_metrics(a, c, _ALL)  # two cards
        for sample in (a, b, c):
            adapter.gpm_sample_free(sample)
        with pytest.raises(NvmlCallFailed):
            adapter.gpm_sample_free(a)  # freed twice
        assert sim.gpm_buffers_alive() == 0
    assert adapter.errors_by_call == {"nvmlGpmMetricsGet": 2, "nvmlGpmSampleFree": 1}


def test_a_metric_the_card_cannot_compute_is_left_out() -> None:
    adapter = Nvml(_sim())
    with adapter.session():
        a, b = adapter.gpm_sample_alloc(), adapter.gpm_sample_alloc()
        adapter.gpm_sample(adapter.handle(2), a)
        adapter.gpm_sample(adapter.handle(2), b)
        got = adapter.gpm_metrics(a, b, (nvml.GPM_GRAPHICS_UTIL, 160))  # 160: not simulated
    assert set(got) == {nvml.GPM_GRAPHICS_UTIL}


def test_cards_before_hopper_and_bindings_without_gpm_are_unsupported() -> None:
    adapter = Nvml(_sim(architecture=8))  # Ampere
    with adapter.session():
        assert not adapter.gpm_supported(adapter.handle(0))

    class OldBinding:
        NVMLError = NVMLError

    assert not Nvml(OldBinding()).gpm_supported(object())


def test_a_gpu_instance_is_sampled_on_its_own() -> None:
    sim = _sim("nvidia-h100x8-mig")
    adapter = Nvml(sim)
    with adapter.session():
        card = adapter.handle(0)
        gi = adapter.create_gpu_instance(card, 2, 0, 4)  # 3g.40gb
        a, b = adapter.gpm_sample_alloc(), adapter.gpm_sample_alloc()
        adapter.gpm_sample(card, a, gi.id)
        adapter.gpm_sample(card, b, gi.id)
        assert 0 < adapter.gpm_metrics(a, b, _ALL)[nvml.GPM_GRAPHICS_UTIL] <= 100
        with pytest.raises(NvmlCallFailed, match="INVALID_ARGUMENT"):
            adapter.gpm_sample(card, a, gi.id + 1)  # no such GPU instance
        with pytest.raises(nvml.NvmlUnsupported):
            adapter.gpm_sample(adapter.handle(4), a, 1)  # MIG off


# -- the sampler --------------------------------------------------------------------------------


def test_activity_is_a_ratio_clamped_to_one() -> None:
    got = gpm.activity({nvml.GPM_GRAPHICS_UTIL: 42.0, nvml.GPM_SM_UTIL: 100.4,
                        nvml.GPM_DRAM_BW_UTIL: float("nan"), nvml.GPM_ANY_TENSOR_UTIL: 18.5})  # fmt: skip
    assert got == Activity(gr_engine_active=0.42, sm_active=1.0, tensor_active=0.185)


def test_the_first_pass_has_nothing_and_a_pass_too_soon_reuses_the_last() -> None:
    sim = _sim()
    now = [100.0]
    sampler = GpmSampler(Nvml(sim), clock=lambda: now[0])
    uuid = sim.cards[1].uuid
    with sampler.nvml.session():
        card = sampler.nvml.handle(1)
        assert sampler.card(card, uuid) is None  # one sample is not a rate
        now[0] += 15
        first = sampler.card(card, uuid)
        assert first is not None and first.gr_engine_active is not None
        taken = sim.calls.count(("nvmlGpmSampleGet", 1))
        now[0] += 0.05  # under NVML's 100 ms refresh
        assert sampler.card(card, uuid) is first
        assert sim.calls.count(("nvmlGpmSampleGet", 1)) == taken
        assert sampler.held() == sim.gpm_buffers_alive() == 2
        sampler.close()
    assert sim.gpm_buffers_alive() == 0
    assert sim.calls.count(("nvmlGpmQueryDeviceSupport", 1)) == 1  # asked once per card


def test_a_failed_sample_frees_its_buffers_and_starts_over(tmp_path: Path) -> None:
    sim = _sim()
    sampler = GpmSampler(Nvml(sim), min_interval_s=0)
    uuid = sim.cards[0].uuid
    with sampler.nvml.session():
        card = sampler.nvml.handle(0)
        sampler.card(card, uuid)
        sim.cards = (msgspec.structs.replace(sim.cards[0], faults={"nvmlGpmSampleGet": "UNKNOWN"}),
                     *sim.cards[1:])  # fmt: skip
        with pytest.raises(NvmlCallFailed):
            sampler.card(card, uuid)
        assert sim.gpm_buffers_alive() == 0
        sim.cards = (msgspec.structs.replace(sim.cards[0], faults={}), *sim.cards[1:])
        assert sampler.card(card, uuid) is None  # a new first sample


# -- the backend --------------------------------------------------------------------------------


def test_every_card_of_the_mig_profile_gets_activity_and_each_instance_its_own(
    tmp_path: Path,
) -> None:
    r = _mig_rig(tmp_path)
    first = _wire(r.backend.sample())
    assert all("grEngineActive" not in card for card in first)  # one sample: no rate yet
    second = _wire(r.backend.sample())
    for card in second:
        assert 0 <= card["grEngineActive"] <= 1 and 0 <= card["smActive"] <= 1
    for card in second[:4]:  # MIG on: no NVML utilization, GPM activity per instance
        assert "coresUtilization" not in card
        (instance,) = card["migInstances"]
        assert 0 < instance["grEngineActive"] <= 1
        assert set(instance) >= {"smActive", "smOccupancy", "dramActive", "tensorActive"}
        assert instance["tensorActive"] <= instance["grEngineActive"]
    assert 0.5 <= second[4]["grEngineActive"] <= 0.6  # utilizationPercent 55, +-5 points
    assert r.nvml.errors_by_call == {}


def test_mig_profile_metrics_have_an_activity_series_for_every_gpu(tmp_path: Path) -> None:
    """The issue's gap: the 4 MIG cards had no utilization series; now each card has
    DCGM_FI_PROF_GR_ENGINE_ACTIVE's series, and each GPU instance its own, labelled."""
    r = _mig_rig(tmp_path)
    groups = r.backend.detect()
    r.backend.sample()
    sample = devices.MonitorSample(manufacturer="nvidia", timestamp="t",
                                   accelerators=tuple(r.backend.sample()))  # fmt: skip
    families = {f.name: f for f in metrics.accelerator_families("n", groups, [sample])}
    series = [
        (s.labels["gpu"], s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"], s.value)
        for s in families["gpustack_accelerator_gr_engine_active"].samples
    ]
    assert {gpu for gpu, gi, _, _ in series if not gi} == {str(i) for i in range(8)}
    instances = {(gpu, profile) for gpu, gi, profile, _ in series if gi}
    assert instances == {("0", "1g.10gb"), ("1", "2g.20gb"), ("2", "3g.40gb"), ("3", "7g.80gb")}
    assert all(0 <= value <= 1 for *_, value in series)
    for name in ("sm_active", "sm_occupancy", "dram_active", "tensor_active"):
        assert len(families[f"gpustack_accelerator_{name}"].samples) == len(series)


def test_a_card_without_gpm_has_no_activity_series_and_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(tmp_path, faults={i: {"nvmlGpmQueryDeviceSupport": "NOT_SUPPORTED"} for i in (0, 1)})
    cards = list(r.sim.cards)
    cards[2] = msgspec.structs.replace(cards[2], architecture=8)  # Ampere: GPM not offered
    r.sim.cards = tuple(cards)
    r.backend.gpm.min_interval_s = 0
    with caplog.at_level(logging.WARNING):
        r.backend.sample()
        got = _wire(r.backend.sample())
    assert ["grEngineActive" in card for card in got] == [False] * 3 + [True] * 5
    assert r.nvml.errors_by_call == {} and caplog.text == ""
    assert r.sim.gpm_buffers_alive() == 2 * 5


def test_a_failing_gpm_call_costs_only_the_activity(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(tmp_path)
    r.backend.gpm.min_interval_s = 0
    r.backend.sample()
    r.sim.system_faults["nvmlGpmMetricsGet"] = "UNKNOWN"  # it takes no card: all fail
    with caplog.at_level(logging.WARNING):
        got = _wire(r.backend.sample())
    assert all("grEngineActive" not in card and card["temperature"] for card in got)
    assert "nvmlGpmMetricsGet" in caplog.text
    assert r.sim.gpm_buffers_alive() == 0  # every card's samples were dropped
    r.sim.system_faults.clear()
    r.backend.sample()
    assert all("grEngineActive" in card for card in _wire(r.backend.sample()))


def test_a_destroyed_instance_and_a_closed_backend_free_their_samples(tmp_path: Path) -> None:
    r = _mig_rig(tmp_path)
    r.backend.sample()
    held = r.sim.gpm_buffers_alive()
    assert held == r.backend.gpm.held() > 0
    with r.nvml.session():
        (mig,) = r.nvml.mig_devices(r.nvml.handle(0))
        gi = next(
            g for p in range(5) for g in r.nvml.gpu_instances(r.nvml.handle(0), p, 8)
            if g.id == mig.gpu_instance_id
        )  # fmt: skip
        for ci in r.nvml.compute_instances(gi.handle):
            r.nvml.destroy_compute_instance(ci.handle)
        r.nvml.destroy_gpu_instance(gi.handle)
    r.backend.sample()
    # One buffer per card and instance after a first pass, two after the second: the
    # destroyed instance's was freed.
    assert held == 8 + 4
    assert r.sim.gpm_buffers_alive() == r.backend.gpm.held() == 2 * (held - 1)
    r.backend.sample()
    r.backend.close()
    assert r.sim.gpm_buffers_alive() == 0 and r.backend.gpm.held() == 0
    assert r.sim.refcount == 0


# -- fidelity to nvidia-ml-py ---------------------------------------------------------------------


def test_metric_ids_are_the_bindings_and_the_simulators() -> None:
    pynvml = pytest.importorskip("pynvml")
    ours = {
        "GRAPHICS_UTIL": nvml.GPM_GRAPHICS_UTIL,
        "SM_UTIL": nvml.GPM_SM_UTIL,
        "SM_OCCUPANCY": nvml.GPM_SM_OCCUPANCY,
        "DRAM_BW_UTIL": nvml.GPM_DRAM_BW_UTIL,
        "ANY_TENSOR_UTIL": nvml.GPM_ANY_TENSOR_UTIL,
    }
    for name, value in ours.items():
        assert getattr(pynvml, f"NVML_GPM_METRIC_{name}") == value
        assert getattr(SimulatedNvml, f"NVML_GPM_METRIC_{name}") == value


def test_the_adapter_fills_and_reads_the_bindings_own_request() -> None:
    """Field names and types as nvidia-ml-py's ``c_nvmlGpmMetricsGet_t`` has them."""
    pynvml = pytest.importorskip("pynvml")
    older, newer = pynvml.c_nvmlGpmSample_t(), pynvml.c_nvmlGpmSample_t()
    asked: list[tuple[int, int, list[int]]] = []

    def metrics_get(request: Any) -> Any:
        assert isinstance(request, pynvml.c_nvmlGpmMetricsGet_t)
        count = int(request.numMetrics)
        asked.append((request.version, count, [request.metrics[i].metricId for i in range(count)]))
        request.metrics[0].nvmlReturn, request.metrics[0].value = 0, 37.5
        request.metrics[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    binding = type("Binding", (), {
        "NVMLError": pynvml.NVMLError,
        "c_nvmlGpmMetricsGet_t": pynvml.c_nvmlGpmMetricsGet_t,
        "NVML_GPM_METRICS_GET_VERSION": pynvml.NVML_GPM_METRICS_GET_VERSION,
        "nvmlGpmMetricsGet": staticmethod(metrics_get),
    })()  # fmt: skip
    got = Nvml(binding).gpm_metrics(older, newer, (nvml.GPM_GRAPHICS_UTIL, nvml.GPM_SM_UTIL))
    assert got == {nvml.GPM_GRAPHICS_UTIL: 37.5}
    assert asked == [(pynvml.NVML_GPM_METRICS_GET_VERSION, 2, [1, 2])]


# -- dm monitor ----------------------------------------------------------------------------------


def test_dm_monitor_primes_gpm_so_its_one_pass_has_activity(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = DetectSettings(manufacturers=("nvidia",), simulate="nvidia-h100x8-mig",
                              output="json")  # fmt: skip
    assert oneshots.monitor_command(settings) == 0
    (sample,) = json.loads(capsys.readouterr().out)
    cards = sample["accelerators"]
    assert [c["grEngineActive"] for c in cards[:4]] == [0, 0, 0, 0]  # MIG on, nothing carved
    assert all(0.5 <= c["grEngineActive"] <= 0.6 for c in cards[4:])  # 55 % +- 5 points


def test_dm_monitor_on_cards_without_gpm_reports_no_activity(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = DetectSettings(manufacturers=("amd",), simulate="amd-rx7800xt-x2", output="json")
    assert oneshots.monitor_command(settings) == 0
    (sample,) = json.loads(capsys.readouterr().out)
    assert all("grEngineActive" not in c for c in sample["accelerators"])


def test_a_whole_card_sample_refused_in_mig_mode_is_not_retried_and_instances_still_work(
    tmp_path: Path,
) -> None:
    """Should a MIG-mode card refuse the whole-card sample (only per-instance ones), its
    instances still have their activity, and the refused call is not made every pass."""
    r = _mig_rig(tmp_path, faults={0: {"nvmlGpmSampleGet": "NOT_SUPPORTED"}})
    for _ in range(3):
        first = _wire(r.backend.sample())[0]
    assert "grEngineActive" not in first and 0 < first["migInstances"][0]["grEngineActive"] <= 1
    assert r.sim.calls.count(("nvmlGpmSampleGet", 0)) == 1
    assert r.nvml.errors_by_call == {}

"""dcgm-exporter's stock Grafana dashboard reads ``dm serve --metrics-names=dcgm`` unchanged.

The queries below are the stock dashboard's (NVIDIA's dcgm-exporter repository, also Grafana
dashboard 12239), written out here from its public description: two variables,
``instance`` and ``gpu``, both ``label_values`` of ``DCGM_FI_DEV_GPU_TEMP``, and one panel per
query, each selecting a ``DCGM_FI_*`` metric by ``instance=~"$instance", gpu=~"$gpu"``, legend
``GPU {{gpu}}``. :mod:`promselect` does what Prometheus and Grafana would: add the scrape
target's ``instance`` and ``job`` labels, expand a variable to its values (one, or all as
Grafana's "All" regex), and select the series whose name and labels match. The scrape is a
real HTTP GET of a whole in-process agent's plain ``/metrics`` (simulated H200s, a real
nats-server).

``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` (the "Tensor Core Utilization" panel) is GPM's tensor
activity (``ANY_TENSOR_UTIL``), a rate over two samples: the scrape waits for the agent's
second monitor pass.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families
from promselect import all_regex, label_values, scrape_series, select_first

from agent.serve.running import Running, run
from agent.serve.settings import ServeSettings, settings_from
from agent.testing import FakeKubelet
from bus import state
from bus.connection import connect
from bus.embedded import free_port
from bus.testing import eventually, nats_server, settings_for
from gpustack_operator.flags import FlagError
from gpustack_operator.main import options_for

pytestmark = pytest.mark.anyio

VARIABLES = {
    "instance": "label_values(DCGM_FI_DEV_GPU_TEMP, instance)",
    "gpu": "label_values(DCGM_FI_DEV_GPU_TEMP, gpu)",
}
_BY = '{instance=~"$instance", gpu=~"$gpu"}'
PANELS = {
    "GPU Temperature": f"DCGM_FI_DEV_GPU_TEMP{_BY}",
    "GPU Avg. Temp": f"avg(DCGM_FI_DEV_GPU_TEMP{_BY})",
    "GPU Power Usage": f"DCGM_FI_DEV_POWER_USAGE{_BY}",
    "GPU Power Total": f"sum(DCGM_FI_DEV_POWER_USAGE{_BY})",
    "GPU SM Clocks": f"DCGM_FI_DEV_SM_CLOCK{_BY} * 1000000",
    "GPU Utilization": f"DCGM_FI_DEV_GPU_UTIL{_BY}",
    "GPU Framebuffer Mem Used": f"DCGM_FI_DEV_FB_USED{_BY}",
    "Tensor Core Utilization": f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{_BY}",
}
LEGEND_LABELS = ("gpu",)
"""The panels' legend is ``GPU {{gpu}}``."""


async def _scrape(tmp_path: Path, naming: str) -> str:
    port = free_port()
    async with nats_server(tmp_path) as server:
        bus = settings_for(server)
        async with connect(bus) as conn:
            await state.ensure_streams(conn, bus)  # the worker's job: agents may not
        settings = ServeSettings.for_tests(
            str(tmp_path), bus=bus, metrics_http_port=port, metrics_names=naming
        )
        url = f"http://127.0.0.1:{port}/metrics"
        async with aiohttp.ClientSession() as session, anyio.create_task_group() as tg:
            running: Running = await tg.start(run, settings)
            assert running.server.port

            async def sampled() -> bool:  # GPM's rates come with the second pass
                async with session.get(url) as response:
                    return "tensor_active{" in (await response.text()).lower()

            await eventually(sampled, timeout_s=20)
            async with session.get(url) as response:
                assert response.status == 200
                text = await response.text()
            tg.cancel_scope.cancel()
    return text


async def test_the_stock_dcgm_dashboard_queries_select_our_series(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    del kubelet  # the agent registers with it; only its socket is needed
    text = await _scrape(tmp_path, "dcgm")
    series = scrape_series(text, {"instance": "10.0.0.7:9400", "job": "gpustack-operator"})
    values = {v: label_values(series, q, {}) for v, q in VARIABLES.items()}
    assert values == {"instance": ["10.0.0.7:9400"], "gpu": [str(i) for i in range(8)]}

    everything = {v: all_regex(vs) for v, vs in values.items()}
    for title, query in PANELS.items():
        picked = select_first(series, query, everything)
        assert len(picked) == 8, (title, len(picked))
        for _, labels in picked:
            for label in (*LEGEND_LABELS, "UUID", "modelName", "Hostname", "device"):
                assert labels[label], (title, label)
        one = select_first(series, query, {"instance": "10.0.0.7:9400", "gpu": "3"})
        assert [labels["gpu"] for _, labels in one] == ["3"], title

    # DCGM's units: MiB for the frame buffer, MHz for the clock (the panel multiplies to Hz).
    families = {f.name: f for f in text_string_to_metric_families(text)}
    used = families["DCGM_FI_DEV_FB_USED"].samples
    total = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_FB_TOTAL"].samples}
    assert all(0 <= s.value <= total[s.labels["gpu"]] < 200_000 for s in used)
    assert {s.value for s in families["DCGM_FI_DEV_SM_CLOCK"].samples} == {1980.0}
    # Tensor activity: a ratio 0-1 (DCGM's unit), below the engine's (the pipes are part of it).
    tensor = {s.labels["gpu"]: s.value for s in families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples}
    engine = {s.labels["gpu"]: s.value for s in families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples}
    assert all(0 <= tensor[g] <= engine[g] <= 1 for g in tensor) and any(tensor.values())
    # Series with no DCGM field keep our name; DCGM-named ones are not doubled.
    assert "gpustack_accelerator_unhealthy" in families
    assert "gpustack_accelerator_memory_used_mib" not in families


async def test_our_default_names_leave_the_stock_dashboard_empty(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    """Why the option exists: with ``gpustack`` names every stock query selects nothing."""
    del kubelet
    series = scrape_series(await _scrape(tmp_path, "gpustack"), {"instance": "i", "job": "j"})
    assert label_values(series, VARIABLES["gpu"], {}) == []
    assert all(
        select_first(series, q, {"instance": ".*", "gpu": ".*"}) == [] for q in PANELS.values()
    )


async def test_both_names_expose_each_dcgm_series_twice_with_the_same_values(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    del kubelet
    text = await _scrape(tmp_path, "both")
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def by_gpu(name: str) -> dict[str, float]:
        return {s.labels["gpu"]: s.value for s in families[name].samples}

    assert by_gpu("DCGM_FI_DEV_FB_TOTAL") == by_gpu("gpustack_accelerator_memory_total_mib")
    assert len(by_gpu("DCGM_FI_DEV_GPU_TEMP")) == 8
    # A counter keeps DCGM's exact sample name (no _total), ours keeps _total.
    energy = families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples
    assert energy and {s.name for s in energy} == {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}
    ours = families["gpustack_accelerator_energy_millijoules"].samples
    assert {s.name for s in ours} == {"gpustack_accelerator_energy_millijoules_total"}


def test_metrics_names_is_read_by_the_settings_builder() -> None:
    serve = ("device-manager", "serve")
    assert settings_from(options_for(serve, ["--node-name=n"])).metrics_names == "gpustack"
    on = settings_from(options_for(serve, ["--node-name=n", "--metrics-names=dcgm"]))
    assert on.metrics_names == "dcgm"
    env = {"GPUSTACK_METRICS_NAMES": "both"}  # as the DaemonSet would set it
    assert settings_from(options_for(serve, ["--node-name=n"], env)).metrics_names == "both"
    with pytest.raises(FlagError, match="--metrics-names"):
        options_for(serve, ["--node-name=n", "--metrics-names=DCGM_FI"])

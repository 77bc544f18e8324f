"""The device agent's /metrics as DCGM exporter users read them, from a whole agent in-process:
simulated H200s, a real nats-server, a grpcio kubelet that also serves pod-resources.

- the container holding a card is on that card's series (``pod``, ``namespace``, ``container``),
  learnt from kubelet's pod-resources API, as DCGM exporter learns it;
- the DCGM default fields NVML gives are there, counters as counters, with no ``_created``;
- the last XID of a card (``DCGM_FI_DEV_XID_ERRORS``);
- ``--metrics-port`` serves the same over plain HTTP.
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path

import aiohttp
import anyio
import anyio.to_thread
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.deviceplugin.settings import DevicePluginSettings
from agent.devices import nvidia
from agent.devices.simulation.fakenvml import SimulatedNvml
from agent.serve.running import Running, run
from agent.serve.settings import ServeSettings, settings_from
from agent.testing import FakeKubelet, unary
from bus import state
from bus.connection import connect
from bus.embedded import free_port
from bus.testing import eventually, nats_server, settings_for
from gpustack_operator.main import options_for
from proto.deviceplugin import v1beta1 as dp
from proto.podresources import v1 as podresources

pytestmark = pytest.mark.anyio


def _library(running: Running) -> SimulatedNvml:
    (backend,) = [b for b in running.backends if isinstance(b, nvidia.NvidiaBackend)]
    assert isinstance(backend.nvml.library, SimulatedNvml)
    return backend.nvml.library


async def _text(url: str, context: ssl.SSLContext | None = None) -> str:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
        assert response.status == 200
        return await response.text()


def _pod(token: str) -> podresources.PodResources:
    devices = podresources.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[token])
    container = podresources.ContainerResources(name="main", devices=[devices])
    return podresources.PodResources(name="llm", namespace="ai", containers=[container])


async def test_metrics_carry_the_holding_pod_the_dcgm_fields_and_the_last_xid(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    socket = tmp_path / "pod-resources.sock"
    kubelet.serve_pod_resources(socket)
    plain_port = free_port()
    async with nats_server(tmp_path) as server:
        bus = settings_for(server)
        async with connect(bus) as conn:
            await state.ensure_streams(conn, bus)  # the worker's job: agents may not
        plugins = dataclasses.replace(
            DevicePluginSettings.for_tests(str(tmp_path)),
            pod_resources_socket=str(socket),
            pod_resources_period_s=0.2,
        )
        settings = ServeSettings.for_tests(
            str(tmp_path), bus=bus, deviceplugin=plugins, metrics_http_port=plain_port
        )
        async with anyio.create_task_group() as tg:
            running: Running = await tg.start(run, settings)
            uuid = _library(running).cards[2].uuid
            token = f"nvidia-h200:{uuid}:0000"
            kubelet.live = [_pod(token)]
            await kubelet.registered_all(["nvidia.com/gpu"])
            endpoint = kubelet.endpoint("nvidia.com/gpu")
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=[token])]
            )
            await anyio.to_thread.run_sync(
                unary, endpoint, "/v1beta1.DevicePlugin/Allocate", request,
                dp.AllocateResponse.FromString,
            )  # fmt: skip
            _library(running).inject_xid(2, 13)  # ignored for health, still the last XID
            context = ssl.create_default_context(cadata=running.server.certificate_pem.decode())
            https = f"https://localhost:{running.server.port}/metrics"

            async def attributed() -> bool:
                text = await _text(https, context)
                return (
                    'pod="llm"' in text
                    and "gpustack_accelerator_last_xid{" in text
                    and (
                        f'UUID="{uuid}"' in text
                        and any(
                            s.value == 13
                            for f in text_string_to_metric_families(text)
                            if f.name == "gpustack_accelerator_last_xid"
                            for s in f.samples
                            if s.labels["UUID"] == uuid
                        )
                    )
                )

            await eventually(attributed, timeout_s=20)
            text = await _text(https, context)
            plain = await _text(f"http://127.0.0.1:{plain_port}/metrics")
            tg.cancel_scope.cancel()

    families = {f.name: f for f in text_string_to_metric_families(text)}
    used = families["gpustack_accelerator_memory_used_mib"].samples
    held = [s.labels for s in used if s.labels["UUID"] == uuid]
    assert [(h["pod"], h["namespace"], h["container"]) for h in held] == [("llm", "ai", "main")]
    others = {(s.labels["pod"], s.labels["namespace"]) for s in used if s.labels["UUID"] != uuid}
    assert others == {("", "")} and len(used) == 8
    assert held[0]["DCGM_FI_DRIVER_VERSION"] == "570.124.06"

    assert "_created" not in text  # nowhere: counters, histograms
    energy = families["gpustack_accelerator_energy_millijoules"]
    assert energy.type == "counter" and all(s.name.endswith("_total") for s in energy.samples)
    clocks = {s.value for s in families["gpustack_accelerator_sm_clock_mhz"].samples}
    assert clocks == {1980.0}
    links = {s.value for s in families["gpustack_accelerator_nvlink_links_up"].samples}
    assert links == {18.0}
    xids = {s.labels["UUID"]: s.value for s in families["gpustack_accelerator_last_xid"].samples}
    assert xids[uuid] == 13 and sum(xids.values()) == 13

    plain_families = {f.name for f in text_string_to_metric_families(plain)}
    assert {"gpustack_accelerator_memory_used_mib", "gpustack_agent_nvml_errors"} <= plain_families


def test_metrics_port_is_read_by_the_settings_builder() -> None:
    """``dm serve --metrics-port``: off by default, the port when given."""
    serve = ("device-manager", "serve")
    assert settings_from(options_for(serve, ["--node-name=n"])).metrics_http_port == 0
    on = settings_from(options_for(serve, ["--node-name=n", "--metrics-port=9400"]))
    assert on.metrics_http_port == 9400

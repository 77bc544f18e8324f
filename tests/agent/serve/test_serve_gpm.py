"""``dm serve`` on the MIG profile, in-process (a real nats-server, a fake kubelet): every GPU
has an activity series on /metrics, the MIG cards too, a GPU instance carved while the agent
runs gets its own, and the agent frees every GPM sample buffer when it stops."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import anyio
import anyio.to_thread
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.devices import nvidia
from agent.serve.running import Running, run
from agent.serve.settings import ServeSettings
from agent.testing import FakeKubelet
from bus import state
from bus.connection import connect
from bus.testing import eventually, nats_server, settings_for

pytestmark = pytest.mark.anyio

_ACTIVE = "gpustack_accelerator_gr_engine_active"


def _backend(running: Running) -> nvidia.NvidiaBackend:
    (backend,) = [b for b in running.backends if isinstance(b, nvidia.NvidiaBackend)]
    return backend


async def _series(url: str, name: str, context: ssl.SSLContext) -> list[dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
        assert response.status == 200
        text = await response.text()
    return [s.labels for f in text_string_to_metric_families(text) if f.name == name
            for s in f.samples]  # fmt: skip


def _carve(backend: nvidia.NvidiaBackend) -> int:
    """A 3g.40gb GPU instance with its compute instance on card 1; its GI id."""
    with backend.nvml.session():
        gi = backend.nvml.create_gpu_instance(backend.nvml.handle(1), 2, 0, 4)
        backend.nvml.create_compute_instance(gi.handle, 3)
    return gi.id


async def test_every_gpu_of_the_mig_profile_has_activity_and_instances_their_own(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    async with nats_server(tmp_path) as server:
        bus = settings_for(server)
        async with connect(bus) as conn:
            await state.ensure_streams(conn, bus)
        settings = ServeSettings.for_tests(str(tmp_path), bus=bus, simulate="nvidia-h100x8-mig")
        async with anyio.create_task_group() as tg:
            running: Running = await tg.start(run, settings)
            backend = _backend(running)
            url = f"https://localhost:{running.server.port}/metrics"
            tls = ssl.create_default_context(cadata=running.server.certificate_pem.decode())

            async def every_gpu() -> bool:
                return len({s["gpu"] for s in await _series(url, _ACTIVE, tls)}) == 8

            await eventually(every_gpu, timeout_s=20)
            utilization = await _series(url, "gpustack_accelerator_utilization_percent", tls)
            assert {s["gpu"] for s in utilization} == {"4", "5", "6", "7"}  # NVML's, MIG off

            gi = await anyio.to_thread.run_sync(_carve, backend)

            async def instance() -> bool:
                return any(s["GPU_I_ID"] for s in await _series(url, _ACTIVE, tls))

            await eventually(instance, timeout_s=20)
            (labels,) = [s for s in await _series(url, _ACTIVE, tls) if s["GPU_I_ID"]]
            assert (labels["gpu"], labels["GPU_I_ID"], labels["GPU_I_PROFILE"]) == (
                "1",
                str(gi),
                "3g.40gb",
            )
            assert backend.gpm.held() > 0
            tg.cancel_scope.cancel()
    library = backend.nvml.library
    assert library.gpm_buffers_alive() == 0 and library.refcount == 0

"""Self-healing bus state: NATS restarts with an empty store under a running worker (KV sink),
device agent and model agent; the streams, both buckets and the node's state come back by
themselves, in seconds, not at the next periodic resync (minutes)."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import anyio
import pytest

from agent.models import running as models_running
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings
from agent.serve import running as agent_running
from agent.serve.settings import ServeSettings
from agent.testing import fake_kubelet
from bus import connection, kv, state, subjects, testing
from bus.embedded import ServerProcess
from bus.errors import StateUnavailable
from bus.settings import BusSettings
from controlplane.worker import running
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio

NODE = "n1"
STREAMS = (state.STATE_STREAM, state.SAMPLES_STREAM, state.HISTORY_STREAM)
BUCKETS = (kv.LEDGER_BUCKET, kv.AGENTS_BUCKET)
HTTPS = HttpsSettings(bind_address="127.0.0.1", port=0, auth="none")


def _models(tmp_path: Path, bus: BusSettings) -> ModelManagerSettings:
    return ModelManagerSettings(
        node_name=NODE,
        kubelet_dir=tmp_path / "kubelet",
        cache_root=tmp_path / "cache",
        csi_socket=tmp_path / "csi.sock",
        https=HTTPS,
        bus=bus,
        hub_endpoint="http://127.0.0.1:9",  # never asked: nothing is downloaded
    )


async def _whole(bus: BusSettings) -> bool:
    """Every stream and bucket exists (looked up, never created) and the node's devices and
    models are retained, and the worker wrote the node's Devices object to its KV ledger."""
    async with connection.connect(bus, retry=False) as conn:
        try:
            for stream in STREAMS:
                await conn.streams.last_per_subject(stream, subjects.ALL)
            for bucket in BUCKETS:  # read through a handle that never creates it
                await kv.Bucket(conn, bucket).last_values()
        except StateUnavailable:
            return False
        for kind in ("devices", "models"):
            if not await state.snapshot(conn, bus, node=NODE, kind=kind):  # type: ignore[arg-type]
                return False
        ledger = await kv.open_bucket(conn, kv.LEDGER_BUCKET)
        return bool(await ledger.keys("devices.>"))


async def _lose_the_store(server: ServerProcess) -> None:
    """A crash, and a new server on the same port with an empty store."""
    server.kill()
    await server.stop()
    shutil.rmtree(server.store_dir / "js")
    await server.start()


async def test_streams_buckets_and_node_state_come_back_after_a_store_loss(
    tmp_path: Path,
) -> None:
    async with testing.nats_server(tmp_path) as server, anyio.create_task_group() as tg:
        bus = testing.settings_for(server)
        worker = running.WorkerSettings(
            concurrency=16, bus=bus, kube=None, https=HTTPS, resync_s=300.0
        )
        await tg.start(running.run, worker)
        with fake_kubelet(tmp_path / "kubelet.sock"):
            agent = ServeSettings.for_tests(
                str(tmp_path), bus=bus, node_name=NODE, resync_period_s=300.0, heartbeat_s=30.0
            )
            await tg.start(agent_running.run, agent)
            tg.start_soon(models_running.serve, _models(tmp_path, bus), MemoryPolicy())
            await testing.eventually(functools.partial(_whole, bus), timeout_s=20)

            await _lose_the_store(server)
            # Every periodic republish is minutes away (resync 300 s, heartbeat 30 s).
            await testing.eventually(functools.partial(_whole, bus), timeout_s=8)
            tg.cancel_scope.cancel()

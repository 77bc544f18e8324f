"""The dashboard in a real browser: headless Chromium, driven over its DevTools protocol.

1. Against a running ``standalone`` with the simulated 8 x H200 node: the page shows the 8 GPUs,
   one simulated card failing with XID 79 (through the running agent's own NVML) turns
   unhealthy on the page, and when the server goes away the page says it is disconnected.
   Screenshots (``dashboard.png``, ``dashboard-unhealthy.png``, ``dashboard-disconnected.png``)
   are saved in the test's tmp directory.
2. Against ``dashboard`` on a bare nats-server carrying hand-made events: a model downloading
   shows its progress, an allocation shows its mode, pod and units, and an agent whose
   heartbeat stopped is flagged.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from dashboard_browser import NEEDS_CHROMIUM, chromium, until

from agent.devices.simulation import fakenvml
from bus import connection, devices, events, publishing, state, testing
from bus.metrics import BusMetrics
from gpustack_operator import standalone
from gpustack_operator.dashboard import serving
from gpustack_operator.main import options_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(150), NEEDS_CHROMIUM]


def _settings(tmp_path: Path) -> standalone.StandaloneSettings:
    argv = [f"--state-dir={tmp_path / 'state'}", "--nats-port=0", "--worker-port=0",
            "--device-manager-port=0", "--model-manager-port=0", "--dashboard-port=0",
            "--simulate=nvidia-h200x8", "--node-name=laptop.example", "--monitor-period=0.5s",
            "--no-fast-failed"]  # fmt: skip
    return standalone.settings_from(options_for(("standalone",), argv))


async def test_the_page_shows_the_simulated_node_and_reacts_to_a_failing_card(
    tmp_path: Path,
) -> None:
    banners, banner_reader = anyio.create_memory_object_stream[str](1)
    earlier = fakenvml.opened()  # other tests' agents, not yet collected (held: ids stay unique)
    async with chromium(tmp_path / "chromium") as page:
        with banners, banner_reader:
            async with anyio.create_task_group() as tg:
                await tg.start(functools.partial(standalone.run, _settings(tmp_path), out=banners))
                banner = await banner_reader.receive()
                (line,) = [ln for ln in banner.splitlines() if "dashboard:" in ln]
                url = line.split("dashboard:", 1)[1].strip()
                assert url.startswith("http://127.0.0.1:")
                await page.call("Page.enable")
                await page.call("Page.navigate", url=url)
                seen = await until(page, _eight_healthy_gpus_with_charts)
                assert seen["nodes"] == ["laptop.example"]
                assert all(g["memory"].endswith("/ 140.4 GiB") for g in seen["gpus"])
                assert seen["badges"] == ["agent alive"]
                await page.screenshot(tmp_path / "dashboard.png")

                failing = seen["gpus"][3]["uuid"]
                (library,) = [n for n in fakenvml.opened() if all(n is not e for e in earlier)]
                library.inject_xid(3, 79)  # "GPU has fallen off the bus"
                seen = await until(page, functools.partial(_only_unhealthy, failing))
                (card,) = [g for g in seen["gpus"] if g["uuid"] == failing]
                assert "Unhealthy" in card["text"] and "last XID 79" in card["text"]
                await page.screenshot(tmp_path / "dashboard-unhealthy.png")
                tg.cancel_scope.cancel()
        # The server is gone: the page says so, and keeps what it last knew.
        seen = await until(page, lambda s: s.get("connection", "").startswith("disconnected"))
        assert len(seen["gpus"]) == 8
        await page.screenshot(tmp_path / "dashboard-disconnected.png")
    for name in ("dashboard.png", "dashboard-unhealthy.png", "dashboard-disconnected.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def _eight_healthy_gpus_with_charts(state: dict[str, Any]) -> bool:
    gpus = state.get("gpus", [])
    return (
        state.get("ready") == "true"
        and state.get("connection") == "live"
        and len(gpus) == 8
        and all(g["health"] == "healthy" and g["charts"] >= 1 for g in gpus)
    )


def _only_unhealthy(uuid: str, state: dict[str, Any]) -> bool:
    return [g["uuid"] for g in state.get("gpus", []) if g["health"] == "unhealthy"] == [uuid]


def _node_events(node: str) -> list[events.Event]:
    """A node with one H200 held by a pod, a model half downloaded, and an agent whose last
    heartbeat was ten minutes ago (30 s heartbeats: it is three periods silent)."""
    now = datetime.now(UTC)
    card = devices.Accelerator(
        id="GPU-0", index=0, status=devices.AcceleratorStatus(unhealthy=False)
    )
    group = devices.DeviceGroup(id="nvidia-h200", manufacturer="nvidia", name="NVIDIA H200",
                                memory=143771, accelerators=(card,))  # fmt: skip
    sample = devices.AcceleratorSample(id="GPU-0", memory=143771, memory_usage=1024,
                                       cores_utilization=42, unhealthy=False)  # fmt: skip
    model = events.ModelState(model="sha256:abc", state="downloading", bytes_done=500,
                              bytes_total=1000)  # fmt: skip
    return [
        events.DevicesEvent(node=node, ts=now, groups=(group,)),
        events.SamplesEvent(
            node=node,
            ts=now,
            period_s=15.0,
            samples=(
                devices.MonitorSample(
                    manufacturer="nvidia", timestamp=now.isoformat(), accelerators=(sample,)
                ),
            ),
        ),
        events.AllocationEvent(
            node=node,
            ts=now,
            allocation_id="a1",
            action="allocated",
            resource="nvidia.com/gpu.sliced",
            device_ids=("nvidia-h200:GPU-0:0000", "nvidia-h200:GPU-0:0001"),
            pod_namespace="ai",
            pod_name="llm",
            container="main",
        ),
        events.ModelsEvent(
            node=node, ts=now, models=(model,), capacity_bytes=10_000, used_bytes=2_000
        ),
        events.AgentEvent(
            node=node,
            ts=now - timedelta(minutes=10),
            version="9.9.9",
            started_at=now - timedelta(hours=1),
            heartbeat_s=30.0,
        ),
    ]


async def test_models_allocations_and_a_silent_agent_are_shown(tmp_path: Path) -> None:
    async with testing.nats_server(tmp_path) as server:
        bus = testing.settings_for(server)
        async with (
            connection.connect(bus) as conn,
            publishing.publisher(conn, settings=bus, metrics=BusMetrics()) as pub,
        ):
            await state.ensure_streams(conn, bus)
            for event in _node_events("gpu-1"):
                pub.publish(event)
            await pub.wait_sent()
            async with anyio.create_task_group() as tg, chromium(tmp_path / "chromium") as page:
                url = await tg.start(
                    functools.partial(serving.serve, serving.DashboardSettings(bus=bus))
                )
                await page.call("Page.navigate", url=url)
                seen = await until(page, lambda s: bool(s.get("models")) and bool(s.get("gpus")))
                await page.screenshot(tmp_path / "dashboard-models.png")
                tg.cancel_scope.cancel()
    (row,) = seen["models"]
    assert (row["state"], row["progress"]) == ("downloading", 500)
    assert "500 B / 1000 B" in row["text"]
    assert seen["allocations"] == ["sliced ×2 (ai/llm)"]
    (badge,) = seen["badges"]
    assert badge.startswith("agent silent for ")

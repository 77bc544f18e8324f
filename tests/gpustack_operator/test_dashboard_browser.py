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

import dataclasses
import functools
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from dashboard_browser import NEEDS_CHROMIUM, chromium, until

from agent.devices.simulation import fakenvml
from agent.testing import fake_kubelet, unary
from bus import connection, devices, events, publishing, state, testing
from bus.metrics import BusMetrics
from gpustack_operator import standalone
from gpustack_operator.dashboard import serving
from gpustack_operator.main import options_for
from proto.deviceplugin import v1beta1 as dp
from proto.podresources import v1 as podresources

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(150), NEEDS_CHROMIUM]


def _settings(tmp_path: Path) -> standalone.StandaloneSettings:
    argv = [f"--state-dir={tmp_path / 'state'}", "--nats-port=0", "--worker-port=0",
            "--device-manager-port=0", "--model-manager-port=0", "--dashboard-port=0",
            "--simulate=nvidia-h200x8", "--node-name=laptop.example", "--monitor-period=0.5s",
            "--no-fast-failed"]  # fmt: skip
    return standalone.settings_from(options_for(("standalone",), argv))


async def test_the_page_shows_the_simulated_node_and_reacts_to_a_failing_card(
    tmp_path: Path, short_tmp_path: Path
) -> None:
    banners, banner_reader = anyio.create_memory_object_stream[str](1)
    earlier = fakenvml.opened()  # other tests' agents, not yet collected (held: ids stay unique)
    async with chromium(tmp_path / "chromium") as page:
        with banners, banner_reader:
            async with anyio.create_task_group() as tg:
                settings = _settings(short_tmp_path)  # short: the plugins' sockets lie under it
                await tg.start(functools.partial(standalone.run, settings, out=banners))
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
                _keep(tmp_path / "dashboard-unhealthy.png", "dashboard-unhealthy.png")
                tg.cancel_scope.cancel()
        # The server is gone: the page says so, and keeps what it last knew.
        seen = await until(page, lambda s: s.get("connection", "").startswith("disconnected"))
        assert len(seen["gpus"]) == 8
        await page.screenshot(tmp_path / "dashboard-disconnected.png")
    for name in ("dashboard.png", "dashboard-unhealthy.png", "dashboard-disconnected.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


_SCREENSHOTS = os.environ.get("GPUSTACK_DASHBOARD_SCREENSHOTS")
"""A directory to copy the screenshots into (docs/ when a person refreshes the docs' images);
unset in CI, where they stay in the test's tmp directory."""


_POINTS = 60 if _SCREENSHOTS else 4
"""Samples on each chart before the figures are judged (a screenshot for people shows more)."""


def _keep(shot: Path, name: str) -> None:
    if _SCREENSHOTS:
        shutil.copyfile(shot, Path(_SCREENSHOTS) / name)


def _holder(token: str) -> podresources.PodResources:
    held = podresources.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[token])
    container = podresources.ContainerResources(name="main", devices=[held])
    return podresources.PodResources(name="llm-0", namespace="inference", containers=[container])


def _with_kubelet_pod_resources(
    settings: standalone.StandaloneSettings, socket: Path
) -> standalone.StandaloneSettings:
    """``standalone`` asking a kubelet's pod-resources at ``socket`` who holds what."""
    plugins = dataclasses.replace(
        settings.agent.deviceplugin, pod_resources_socket=str(socket), pod_resources_period_s=0.2
    )
    return msgspec.structs.replace(
        settings, agent=msgspec.structs.replace(settings.agent, deviceplugin=plugins)
    )


def _figures(state: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(g["util"], g["temperature"], g["power"]) for g in state.get("gpus", [])]


async def test_the_page_moves_shows_the_cache_and_who_holds_a_card(
    tmp_path: Path, short_tmp_path: Path
) -> None:
    """Against ``standalone`` on the busy simulated node (its load pattern on the wall clock),
    a kubelet stand-in registering the plugins and answering pod-resources: the figures move,
    the charts carry their scale, the model cache shows its capacity with no model, and the
    card a pod was given shows the pod, its namespace, the slice and the units."""
    settings = _settings(short_tmp_path)  # short: the plugins' sockets lie under it
    plugin_dir = Path(settings.agent.deviceplugin.kube_socket).parent
    plugin_dir.mkdir(parents=True)
    banners, banner_reader = anyio.create_memory_object_stream[str](1)
    with fake_kubelet(plugin_dir / "kubelet.sock") as kubelet:
        kubelet.serve_pod_resources(tmp_path / "pod-resources.sock")
        settings = _with_kubelet_pod_resources(settings, tmp_path / "pod-resources.sock")
        async with chromium(tmp_path / "chromium") as page:
            with banners, banner_reader:
                async with anyio.create_task_group() as tg:
                    await tg.start(functools.partial(standalone.run, settings, out=banners))
                    banner = await banner_reader.receive()
                    (line,) = [ln for ln in banner.splitlines() if "dashboard:" in ln]
                    await page.call("Page.navigate", url=line.split("dashboard:", 1)[1].strip())
                    first = await until(page, _eight_healthy_gpus_with_charts)
                    # The node is busy: within a few samples every card's figures change.
                    moved = await until(
                        page,
                        lambda s: (
                            len(_figures(s)) == 8
                            and all(
                                a != b for a, b in zip(_figures(s), _figures(first), strict=True)
                            )
                            and all(max(g["points"]) >= _POINTS for g in s["gpus"])
                        ),
                    )
                    card = moved["gpus"][2]
                    await kubelet.registered_all(["nvidia.com/gpu"])
                    token = f"nvidia-h200:{card['uuid']}:0000"
                    kubelet.live = [_holder(token)]
                    request = dp.AllocateRequest(
                        container_requests=[dp.ContainerAllocateRequest(devices_ids=[token])]
                    )
                    endpoint = kubelet.endpoint("nvidia.com/gpu")
                    assert endpoint is not None
                    await anyio.to_thread.run_sync(
                        unary, endpoint, "/v1beta1.DevicePlugin/Allocate", request,
                        dp.AllocateResponse.FromString,
                    )  # fmt: skip
                    held = await until(
                        page,
                        lambda s: any(r["pod"] == "llm-0" for g in s["gpus"] for r in g["rows"]),
                    )
                    shot = tmp_path / "dashboard-busy.png"
                    await page.screenshot(shot)
                    _keep(shot, "dashboard-busy.png")
                    tg.cancel_scope.cancel()
    usage, power = moved["gpus"][0]["axes"]
    assert (usage["chart"], usage["y"], usage["x"][-1]) == (
        "usage",
        ["100 %", "50 %", "0 %"],
        "now",
    )
    assert usage["x"][0].startswith("−") and usage["caption"].startswith("util ")
    assert power["chart"] == "power" and all(label.endswith(" W") for label in power["y"])
    # Hopper's GPM tensor-pipe activity (bus tensorActive), shown on every card once sampled.
    tensor = [g["tensor"] for g in moved["gpus"]]
    assert all(t and t.endswith(" % active") and 0 <= int(t.split()[0]) <= 100 for t in tensor)
    (cache,) = held["caches"]
    assert cache["reported"] == "true" and cache["capacity"] > 0 and cache["used"] > 0
    assert "No model cached." in cache["text"] and " used of " in cache["text"]
    assert cache["bar"] and cache["bar"].endswith("%")
    (holder,) = [g for g in held["gpus"] if g["rows"]]
    assert holder["uuid"] == card["uuid"]
    assert holder["rows"] == [
        {"pod": "llm-0", "namespace": "inference", "slice": "whole card", "units": 1,
         "text": "inference/llm-0whole card1 (100 %)"}
    ]  # fmt: skip


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
    ready = events.ModelState(model="hf://Qwen/Qwen3-8B@main", state="ready",
                              bytes_done=16_400_000_000, bytes_total=16_400_000_000)  # fmt: skip
    failed = events.ModelState(model="hf://org/gated@main", state="failed", reason="Forbidden",
                               message="Forbidden: the Hub refused the token")  # fmt: skip
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
            charges=(events.CardCharge(accelerator_id="GPU-0", units=400_000),),
            memory_mib=35_840,
            cores_percentage=25,
        ),
        events.ModelsEvent(
            node=node,
            ts=now,
            models=(model, ready, failed),
            capacity_bytes=1_000_000_000_000,
            used_bytes=250_000_000_000,
            stored_bytes=16_400_000_000,
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
                seen = await until(
                    page, lambda s: len(s.get("models", [])) == 3 and bool(s.get("gpus"))
                )
                await page.screenshot(tmp_path / "dashboard-models.png")
                _keep(tmp_path / "dashboard-models.png", "dashboard-models.png")
                tg.cancel_scope.cancel()
    row, done, failed = seen["models"]
    assert (row["state"], row["progress"]) == ("downloading", 500)
    assert "500 B / 1000 B" in row["text"]
    assert (done["state"], done["progress"]) == ("ready", None)
    assert failed["state"] == "failed" and "the Hub refused the token" in failed["text"]
    (cache,) = seen["caches"]
    assert (cache["capacity"], cache["used"], cache["bar"]) == (10**12, 25 * 10**10, "25%")
    assert "232.8 GiB used of 931.3 GiB (25 %) · 15.3 GiB in 3 model(s)" in cache["text"]
    assert seen["allocations"] == ["sliced ×2 (ai/llm)"]
    (gpu,) = seen["gpus"]
    assert gpu["rows"] == [
        {"pod": "llm", "namespace": "ai", "slice": "sliced · 35.0 GiB, 25 % cores", "units": 2,
         "text": "ai/llmsliced · 35.0 GiB, 25 % cores2 (25 %)"}
    ]  # fmt: skip
    (badge,) = seen["badges"]
    assert badge.startswith("agent silent for ")

"""The dashboard in a real browser: headless Chromium, driven over its DevTools protocol,
against a running ``standalone`` with the simulated 8 x H200 node.

It reads the page's DOM (8 GPU cards), makes one simulated card fail with XID 79 through the
running agent's own NVML, waits for the page to show it, and saves a screenshot
(``dashboard.png``, and ``dashboard-unhealthy.png``) under the test's tmp directory.

Chromium is Debian's ``chromium`` (``.ci/run`` installs it). Where it is missing the test is
skipped, unless ``GPUSTACK_REQUIRE_BROWSER=1`` (CI sets it) makes that a failure.
"""

from __future__ import annotations

import base64
import functools
import itertools
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from agent.devices.simulation import fakenvml
from bus import testing
from gpustack_operator import standalone
from gpustack_operator.main import options_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    if os.environ.get("GPUSTACK_REQUIRE_BROWSER") == "1":
        raise RuntimeError("GPUSTACK_REQUIRE_BROWSER=1 but no chromium on PATH")
    pytestmark.append(pytest.mark.skip(reason="no chromium on PATH (apt-get install chromium)"))

_STATE = """JSON.stringify({
  ready: document.body.dataset.ready,
  connection: document.getElementById("connection").textContent,
  nodes: [...document.querySelectorAll(".node")].map((n) => n.dataset.node),
  gpus: [...document.querySelectorAll(".gpu")].map((g) => ({
    uuid: g.dataset.uuid, health: g.dataset.health,
    text: g.querySelector(".health").textContent,
    memory: g.querySelector(".memory").textContent,
    charts: g.querySelectorAll("svg.chart polyline").length,
  })),
  models: document.querySelectorAll(".models").length,
})"""


class DevTools:
    """One page target of a Chromium, over the DevTools protocol's WebSocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        await self.ws.send_json({"id": ident, "method": method, "params": params})
        with anyio.fail_after(30):
            async for message in self.ws:
                reply = json.loads(message.data)
                if reply.get("id") == ident:
                    if "error" in reply:
                        raise AssertionError(f"{method}: {reply['error']}")
                    return dict(reply["result"])
        raise AssertionError(f"the DevTools connection closed during {method}")

    async def state(self) -> dict[str, Any]:
        """What the page shows; ``{"error": …}`` while it cannot tell (still loading)."""
        result = await self.call("Runtime.evaluate", expression=_STATE, returnByValue=True)
        if "exceptionDetails" in result:
            return {"error": result["exceptionDetails"].get("text", "")}
        return dict(json.loads(result["result"]["value"]))

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await anyio.Path(path).write_bytes(base64.b64decode(shot["data"]))


@asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[DevTools]:
    """A headless Chromium with a blank page; the DevTools port it picked is read back from
    its profile (``--remote-debugging-port=0``)."""
    assert CHROMIUM is not None
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}",
            "--window-size=1400,1800", "about:blank"]  # fmt: skip
    process = await anyio.open_process(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"

        async def listening() -> bool:
            return port_file.exists() and bool(port_file.read_text().split())

        await testing.eventually(listening, timeout_s=30)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as r:
                pages = [t for t in await r.json() if t["type"] == "page"]
            async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield DevTools(ws)
    finally:
        with anyio.CancelScope(shield=True):
            process.terminate()
            with anyio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


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
    with banners, banner_reader:
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(standalone.run, _settings(tmp_path), out=banners))
            banner = await banner_reader.receive()
            (line,) = [ln for ln in banner.splitlines() if "dashboard:" in ln]
            url = line.split("dashboard:", 1)[1].strip()
            assert url.startswith("http://127.0.0.1:")
            async with chromium(tmp_path / "chromium") as page:
                await page.call("Page.enable")
                await page.call("Page.navigate", url=url)
                seen = await _until(page, _eight_healthy_gpus_with_charts)
                assert seen["nodes"] == ["laptop.example"]
                assert all(g["memory"].endswith("/ 140.4 GiB") for g in seen["gpus"])
                await page.screenshot(tmp_path / "dashboard.png")

                failing = seen["gpus"][3]["uuid"]
                (library,) = [n for n in fakenvml.opened() if all(n is not e for e in earlier)]
                library.inject_xid(3, 79)  # "GPU has fallen off the bus"
                seen = await _until(page, functools.partial(_only_unhealthy, failing))
                (card,) = [g for g in seen["gpus"] if g["uuid"] == failing]
                assert "Unhealthy" in card["text"] and "last XID 79" in card["text"]
                await page.screenshot(tmp_path / "dashboard-unhealthy.png")
            tg.cancel_scope.cancel()
    for name in ("dashboard.png", "dashboard-unhealthy.png"):
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


async def _until(page: DevTools, check: Any) -> dict[str, Any]:
    """Poll the page's DOM until ``check(state)``; fail with the last state seen."""
    state: dict[str, Any] = {}
    try:
        with anyio.fail_after(45):
            while True:
                state = await page.state()
                if check(state):
                    return state
                await anyio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"the page never got there; last seen: {state}") from None

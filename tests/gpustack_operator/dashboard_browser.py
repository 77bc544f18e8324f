"""Headless Chromium driven over its DevTools protocol, for the dashboard's browser tests.

Chromium is Debian's ``chromium`` (``.ci/run`` installs it). :data:`CHROMIUM` is None where it
is missing; the tests are then skipped, unless ``GPUSTACK_REQUIRE_BROWSER=1`` (CI sets it)
makes that a failure.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from bus import testing

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("GPUSTACK_REQUIRE_BROWSER") == "1":
    raise RuntimeError("GPUSTACK_REQUIRE_BROWSER=1 but no chromium on PATH")
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"
)

_STATE = """JSON.stringify({
  ready: document.body.dataset.ready,
  connection: document.getElementById("connection").textContent,
  nodes: [...document.querySelectorAll(".node")].map((n) => n.dataset.node),
  gpus: [...document.querySelectorAll(".gpu")].map((g) => ({
    uuid: g.dataset.uuid, health: g.dataset.health,
    text: g.querySelector(".health").textContent,
    memory: g.querySelector(".memory").textContent,
    charts: g.querySelectorAll("svg.chart polyline").length,
    util: g.querySelector(".title .util")?.textContent,
    temperature: g.querySelector(".temperature")?.textContent,
    power: g.querySelector(".power")?.textContent,
    tensor: g.querySelector(".tensor")?.textContent ?? null,
    points: [...g.querySelectorAll("svg.chart polyline")].map(
      (p) => p.getAttribute("points").split(" ").length),
    axes: [...g.querySelectorAll("figure.spark")].map((f) => ({
      chart: f.dataset.chart,
      y: [...f.querySelectorAll(".yaxis span")].map((s) => s.textContent),
      x: [...f.querySelectorAll(".xaxis span")].map((s) => s.textContent),
      caption: f.querySelector("figcaption")?.textContent,
    })),
    rows: [...g.querySelectorAll(".alloc-row")].map((r) => ({
      pod: r.dataset.pod, namespace: r.dataset.namespace, slice: r.dataset.slice,
      units: Number(r.dataset.units), text: r.textContent,
    })),
  })),
  caches: [...document.querySelectorAll(".node .cache")].map((c) => ({
    reported: c.dataset.reported, capacity: Number(c.dataset.capacity || 0),
    used: Number(c.dataset.used || 0), text: c.textContent,
    bar: c.querySelector(".fill") ? c.querySelector(".fill").style.width : null,
  })),
  models: [...document.querySelectorAll(".model-row")].map((r) => ({
    state: r.dataset.state, text: r.textContent,
    progress: r.querySelector("progress") ? Number(r.querySelector("progress").value) : null,
  })),
  badges: [...document.querySelectorAll(".node .badge")].map((b) => b.textContent),
  allocations: [...document.querySelectorAll(".gpu .allocation")].map((a) => a.textContent),
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
        """The page down to its footer (not the window's empty rest: smaller files)."""
        bottom = await self.call(
            "Runtime.evaluate", returnByValue=True,
            expression="Math.ceil(document.querySelector('footer').getBoundingClientRect().bottom)",
        )  # fmt: skip
        height = int(bottom.get("result", {}).get("value") or 1800)
        clip = {"x": 0, "y": 0, "width": 1400, "height": max(height, 200), "scale": 1}
        shot = await self.call(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip
        )
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


async def until(
    page: DevTools, check: Callable[[dict[str, Any]], bool], *, timeout_s: float = 45
) -> dict[str, Any]:
    """Poll the page's DOM until ``check(state)``; fail with the last state seen."""
    state: dict[str, Any] = {}
    try:
        with anyio.fail_after(timeout_s):
            while True:
                state = await page.state()
                if check(state):
                    return state
                await anyio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"the page never got there; last seen: {state}") from None

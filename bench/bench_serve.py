"""``dm serve`` benchmarks: steady-state RSS, CPU per monitor pass, XID → Unhealthy latency.

Run: ``.venv/bin/python bench/bench_serve.py [--window S] [--xids N]``. Starts its own
nats-server and a grpcio fake kubelet; accelerators are the simulated ``nvidia-h200x8``.

1. The agent as its own process (the launcher's ``dm serve``, uvloop, monitor period 1 s): RSS after a
   warm-up, and CPU seconds (user + system from ``/proc``) over a window divided by the monitor
   passes the agent counted in that window (its ``/metrics``). Each pass is a detection, a
   sample, the health re-check and the bus publishing that follows.
2. In-process agent (:func:`agent.serve.running.run`): time from ``inject_xid`` on a simulated card to
   the ListAndWatch update marking it Unhealthy, read by a grpcio client as kubelet would.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.devices import nvidia
from agent.serve.running import Running, run
from agent.serve.settings import ServeSettings
from agent.testing import FakeKubelet, Watch, fake_kubelet
from bus import embedded
from bus.settings import BusSettings
from bus.testing import settings_for

# ``BENCH_SMOKE=1`` (``just bench-smoke``, run by CI): tiny sizes, seconds in all, to prove the
# bench still runs; its figures mean nothing.
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")

AGENT = textwrap.dedent(
    """
    import sys
    from gpustack_operator.main import main
    kube_socket, port, nats_url = sys.argv[1:4]
    sys.exit(main(["dm", "serve", "--simulate=nvidia-h200x8", "--monitor-period=1s",
                   f"--kube-socket={kube_socket}", f"--secure-port={port}",
                   "--bind-address=127.0.0.1", f"--nats-url={nats_url}", "--node-name=bench",
                   "--metrics-auth=none"]))
    """
)
"""The agent as production runs it: the launcher and its process runner (uvloop, signals)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def passes(port: int) -> float:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the agent's self-signed certificate
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("gpustack_agent_monitor_pass_seconds_count"):
                return float(line.split()[-1])
    return float("nan")


async def process_figures(directory: Path, nats_url: str, window_s: float) -> None:
    kubelet = FakeKubelet(directory / "kubelet.sock")
    kubelet.serve()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", AGENT, str(kubelet.path), str(port), nats_url]
    proc = subprocess.Popen(args, env=env, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        await anyio.sleep(2.0 if SMOKE else 5.0)  # start-up and the first passes
        cpu0, n0 = cpu_seconds(proc.pid), passes(port)
        await anyio.sleep(window_s)
        cpu1, n1 = cpu_seconds(proc.pid), passes(port)
        rss = rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        kubelet.stop()
    print(f"steady-state RSS, 8 simulated GPUs:  {rss:.1f} MiB (target < 80 MB)")
    per_pass = (cpu1 - cpu0) / (n1 - n0) * 1000 if n1 > n0 else float("nan")
    print(f"CPU per monitor pass:               {per_pass:.2f} ms "
          f"({n1 - n0:.0f} passes in {window_s:.0f} s)")  # fmt: skip


async def xid_latency(directory: Path, count: int, bus_url: str) -> None:
    bus = BusSettings.for_tests(bus_url)
    settings = ServeSettings.for_tests(str(directory), bus=bus, monitor_period_s=1.0)
    with fake_kubelet(directory / "kubelet.sock") as kubelet:
        async with anyio.create_task_group() as tg:
            running: Running = await tg.start(run, settings)
            latencies = await _measure(running, kubelet, count)
            tg.cancel_scope.cancel()
    ms = sorted(x * 1000 for x in latencies)
    print(f"XID -> Unhealthy ListAndWatch update: median {statistics.median(ms):.1f} ms, "
          f"max {ms[-1]:.1f} ms over {len(ms)} XIDs (xid wait {settings.xid_wait_s}s)")  # fmt: skip


async def poll(predicate: Callable[[], bool], interval_s: float = 0.0005) -> None:
    """Wait for a condition that grpcio threads change (no event to wait on)."""
    while not predicate():  # noqa: ASYNC110
        await anyio.sleep(interval_s)


async def _measure(running: Running, kubelet: FakeKubelet, count: int) -> list[float]:
    await poll(lambda: kubelet.endpoint("nvidia.com/gpu") is not None)
    watch = await anyio.to_thread.run_sync(Watch, kubelet.endpoint("nvidia.com/gpu"))
    (backend,) = [b for b in running.backends if isinstance(b, nvidia.NvidiaBackend)]
    library = backend.nvml.library
    out = []
    try:
        await poll(lambda: len(watch.latest()) == 8)
        for i in range(count):
            card = i % len(library.cards)
            uuid = library.cards[card].uuid
            started = time.perf_counter()
            library.inject_xid(card, 62)  # transient: quarantined, recovers later
            await poll(functools.partial(_unhealthy, watch, uuid))
            out.append(time.perf_counter() - started)
            running.observer.book._down.clear()  # bench only: make the card healthy again
            running.observer._refresh(anyio.current_time())
            await poll(lambda: all(h == "Healthy" for _, h in _items(watch)))
    finally:
        await anyio.to_thread.run_sync(watch.close)
    return out


def _unhealthy(watch: Watch, uuid: str) -> bool:
    return any(uuid in d and h == "Unhealthy" for d, h in _items(watch))


def _items(watch: Watch) -> list[tuple[str, str]]:
    return list(watch.latest().items())


async def main(window_s: float, xids: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with embedded.embedded_server(Path(tmp) / "nats") as server:
            url = settings_for(server).url
            proc_dir = Path(tmp) / "proc"
            proc_dir.mkdir()
            await process_figures(proc_dir, url, window_s)
            xid_dir = Path(tmp) / "xid"
            xid_dir.mkdir()
            await xid_latency(xid_dir, xids, url)
    print(f"(threads at exit: {threading.active_count()})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=2.0 if SMOKE else 20.0)
    parser.add_argument("--xids", type=int, default=2 if SMOKE else 40)
    ns = parser.parse_args()
    anyio.run(main, ns.window, ns.xids)

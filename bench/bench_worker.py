"""Worker benchmark: ingest and event-to-object latency for N simulated nodes x 8 GPUs.

Run: ``.venv/bin/python bench/bench_worker.py --nodes 1000 --period 1 --seconds 60``.

Starts its own nats-server and the worker (KV sink: ``standalone``'s ledger in the bus) in a
child process, so the worker's CPU seconds and RSS are its own. The parent plays N node agents:
every ``--period`` seconds each node publishes a ``samples`` event (8 accelerators) and its
``devices`` event (unchanged spec: folded, no write), and ``--change`` of the nodes also publish
an allocation that flips (allocated/released), which changes ``Devices.status`` (one write).
At the end the worker's HTTPS ``/metrics`` is scraped:

- events/s ingested (``gpustack_worker_events_consumed_total`` over the run);
- p50/p99 event-to-object latency (``gpustack_worker_event_to_object_seconds``, interpolated
  inside histogram buckets the way ``histogram_quantile`` does);
- KV writes per node per minute (``gpustack_worker_api_requests_total{verb="kv_put"}``);
- worker CPU seconds and peak RSS from ``/proc``.

``--profile out.html`` runs the worker under pyinstrument (when installed) to see where time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from bus import codec, connection, embedded, events, subjects
from bus.devices import (
    Accelerator,
    AcceleratorSample,
    AcceleratorStatus,
    DeviceGroup,
    MonitorSample,
)
from bus.serving import HttpsSettings
from bus.settings import BusSettings


def groups(node: str) -> tuple[DeviceGroup, ...]:
    accels = tuple(
        Accelerator(id=f"GPU-{node}-{i}", index=i, status=AcceleratorStatus(unhealthy=False))
        for i in range(8)
    )
    return (
        DeviceGroup(
            id="nvidia-h200", manufacturer="nvidia", name="NVIDIA H200", memory=143771,
            accelerators=accels,
        ),
    )  # fmt: skip


def samples(node: str, period_s: float) -> events.SamplesEvent:
    accels = tuple(
        AcceleratorSample(
            id=f"GPU-{node}-{i}", memory=143771, memory_usage=1000 * i, memory_utilization=i,
            cores_utilization=50 + i, temperature=40 + i, power_usage=300 + i, unhealthy=False,
        )
        for i in range(8)
    )  # fmt: skip
    stamp = datetime.now(UTC).isoformat()
    sample = MonitorSample(manufacturer="nvidia", timestamp=stamp, accelerators=accels)
    return events.SamplesEvent(node=node, period_s=period_s, samples=(sample,))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_child(url: str, port: int) -> None:
    """Child process: the worker with the KV sink until killed."""
    from controlplane import running

    settings = running.WorkerSettings(
        bus=BusSettings.for_tests(url),
        kube=None,
        https=HttpsSettings(bind_address="127.0.0.1", port=port),
        resync_s=3600.0,
    )
    anyio.run(running.run, settings)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def total(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **want: str) -> float:
    return sum(
        v for (n, labels), v in m.items()
        if n == name and all(dict(labels).get(k) == x for k, x in want.items())
    )  # fmt: skip


def quantile(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, q: float) -> float:
    buckets = sorted(
        (float(dict(labels)["le"]), v) for (n, labels), v in m.items() if n == f"{name}_bucket"
    )
    count = buckets[-1][1] if buckets else 0
    if not count:
        return float("nan")
    rank, lo, below = q * count, 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * ((rank - below) / max(cum - below, 1e-9))
        lo, below = le, cum
    return lo


def proc_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, RSS bytes) of ``pid`` and its children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(
        int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu, rss


async def agents(url: str, nodes: list[str], period_s: float, seconds: float, change: float) -> int:
    """Publish every node's events each period for ``seconds``; returns the events published."""
    sent, flip = 0, max(1, int(len(nodes) * change))
    async with connection.connect(BusSettings.for_tests(url), name="agents") as conn:
        specs = {n: groups(n) for n in nodes}
        start = time.monotonic()
        rnd = 0
        while time.monotonic() - start < seconds:
            began = time.monotonic()
            now = datetime.now(UTC)
            for i, n in enumerate(nodes):
                evs: list[events.Event] = [
                    samples(n, period_s),
                    events.DevicesEvent(node=n, ts=now, groups=specs[n]),
                ]
                if (i + rnd) % len(nodes) < flip:
                    evs.append(events.AllocationEvent(
                        node=n, ts=now, allocation_id="pod/c",
                        action="allocated" if rnd % 2 == 0 else "released",
                        resource="nvidia.com/gpu", device_ids=(f"nvidia-h200:GPU-{n}-0:0",),
                    ))  # fmt: skip
                for e in evs:
                    await conn.publish(subjects.subject(n, events.kind_of(e)), codec.encode(e))
                sent += len(evs)
            await conn.flush()
            rnd += 1
            await anyio.sleep(max(0.0, period_s - (time.monotonic() - began)))
    return sent


async def bench(n: int, period_s: float, seconds: float, change: float, profile: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        async with embedded.embedded_server(Path(tmp) / "nats") as server:
            port = free_port()
            cmd = [sys.executable, __file__, "--worker", server.url, "--port", str(port)]
            if profile:
                cmd = [sys.executable, "-m", "pyinstrument", "-r", "html", "-o", profile,
                       __file__, "--worker", server.url, "--port", str(port)]  # fmt: skip
            child = subprocess.Popen(cmd)  # noqa: ASYNC220 (a bench: blocking is fine)
            try:
                for _ in range(200):
                    try:
                        scrape(port)
                        break
                    except OSError:
                        await anyio.sleep(0.1)
                nodes = [f"node-{i:05d}.cluster.local" for i in range(n)]
                cpu0, _ = proc_usage(child.pid)
                m0 = scrape(port)
                t0 = time.monotonic()
                sent = await agents(server.url, nodes, period_s, seconds, change)
                await anyio.sleep(min(5.0, period_s * 2))  # drain
                elapsed = time.monotonic() - t0
                cpu1, rss = proc_usage(child.pid)
                m1 = scrape(port)
            finally:
                child.terminate()
                child.wait(30)
    consumed = total(m1, "gpustack_worker_events_consumed_total") - total(
        m0, "gpustack_worker_events_consumed_total"
    )
    puts = total(m1, "gpustack_worker_api_requests_total", verb="kv_put") - total(
        m0, "gpustack_worker_api_requests_total", verb="kv_put"
    )
    name = "gpustack_worker_event_to_object_seconds"
    return {
        "nodes": n,
        "period_s": period_s,
        "published": sent,
        "consumed": int(consumed),
        "events_per_s": round(consumed / elapsed, 1),
        "p50_s": round(quantile(m1, name, 0.5), 3),
        "p99_s": round(quantile(m1, name, 0.99), 3),
        "kv_writes_per_node_min": round(puts / n / (elapsed / 60), 2),
        "worker_cpu_s": round(cpu1 - cpu0, 1),
        "worker_cpu_pct": round(100 * (cpu1 - cpu0) / elapsed, 1),
        "worker_rss_mib": round(rss / 2**20, 1),
        "queue_depth_end": total(m1, "gpustack_worker_queue_depth"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[100, 300, 1000])
    p.add_argument("--period", type=float, nargs="+", default=[15.0, 1.0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--change", type=float, default=0.05, help="nodes whose status flips a round")
    p.add_argument("--profile", default="", help="write a pyinstrument HTML profile here")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_child(args.worker, args.port)
        return
    for period in args.period:
        for n in args.nodes:
            result = anyio.run(bench, n, period, args.seconds, args.change, args.profile)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

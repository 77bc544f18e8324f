"""Bus benchmarks: decoding subscriber and ``bus watch`` vs bare nats-py, publishing for 1,000 nodes.

Run: ``.venv/bin/python bench/bench_bus.py [--messages N]``. Starts its own nats-server.

1. Subscriber throughput: a separate publisher process sends N sample events (8 accelerators
   each, ~1.3 KB) as fast as it can; we time one subscriber from first to last message,
   once with the bare nats-py callback (counting only) and once through
   ``bus.subscribing`` (subject parse + strict decode + validation). Best of 3 runs each.
2. Publishing: one ``Publisher`` sends a sample for each of 1,000 simulated nodes per round,
   and the full devices spec of 1,000 nodes (JetStream-acknowledged state events); median of 3
   rounds each. ``--publish-only`` skips parts 1 and 3.
3. ``bus watch -o json`` as a user runs it: a child process whose standard output is a pipe this
   script reads, against two bare nats-py peers on the same stream (the retained samples
   stream, so the server works the same for both): a child that writes each payload as a line
   to the same kind of pipe (what ``nats sub --raw`` does), and the in-process counting
   subscriber of part 1. The rate is lines over the time from the first to the last line; a
   subscriber that falls behind drops messages (reported) rather than stalling the run.
   ``--watch-only`` runs this part alone, ``--runs N`` sets its interleaved runs, and
   ``--watch-before SRC`` adds the ``bus watch`` of another source tree (before/after in one run).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import nats
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bus import codec, connection, embedded, events, publishing, state, subjects, subscribing
from bus.devices import AcceleratorSample, MonitorSample
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from bus.testing import example_events

# ``BENCH_SMOKE=1`` (``just bench-smoke``, run by CI): tiny sizes, seconds in all, to prove the
# bench still runs; its figures mean nothing.
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")


def sample_event(node: str) -> events.SamplesEvent:
    accels = tuple(
        AcceleratorSample(
            id=f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd",
            memory=143771,
            memory_usage=1000 * i,
            memory_utilization=i,
            cores_utilization=50 + i,
            temperature=40 + i,
            power_usage=300 + i,
            unhealthy=False,
        )
        for i in range(8)
    )
    sample = MonitorSample(
        manufacturer="nvidia", timestamp="2026-01-01T00:00:00.000000000+00:00", accelerators=accels
    )
    return events.SamplesEvent(node=node, period_s=15.0, samples=(sample,))


async def publisher_process(url: str, count: int) -> None:
    """Child process: publish ``count`` sample events on 100 node subjects, then flush."""
    nc = await nats.connect(url)
    payloads = [
        (
            subjects.subject(f"node-{i}.local", "samples"),
            codec.encode(sample_event(f"node-{i}.local")),
        )
        for i in range(100)
    ]
    for i in range(count):
        subj, data = payloads[i % 100]
        await nc.publish(subj, data)
        if i % 2000 == 0:
            await nc.flush()
    await nc.flush()
    await nc.close()


def start_publisher(url: str, count: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--publisher", url, "--messages", str(count)]
    )


async def bare_run(url: str, count: int) -> float:
    nc = await nats.connect(url)
    done = asyncio.Event()
    state = {"n": 0, "t0": 0.0, "t1": 0.0}

    async def cb(msg: Msg) -> None:
        if state["n"] == 0:
            state["t0"] = time.perf_counter()
        state["n"] += 1
        if state["n"] == count:
            state["t1"] = time.perf_counter()
            done.set()

    await nc.subscribe(subjects.filter_for(kind="samples"), cb=cb, pending_msgs_limit=count)
    await nc.flush()
    proc = start_publisher(url, count)
    await done.wait()
    await nc.close()
    await anyio.to_thread.run_sync(proc.wait)
    return count / (state["t1"] - state["t0"])


async def bus_run(settings: BusSettings, count: int) -> float:
    metrics = BusMetrics()
    async with (
        connection.connect(settings) as conn,
        subscribing.subscribe(
            conn, settings=settings, metrics=metrics, kind="samples", buffer=count
        ) as sub,
    ):
        await conn.flush()
        proc = start_publisher(settings.url, count)
        n = 0
        t0 = 0.0
        async for _ in sub:
            if n == 0:
                t0 = time.perf_counter()
            n += 1
            if n == count:
                break
        t1 = time.perf_counter()
    await anyio.to_thread.run_sync(proc.wait)
    assert metrics.total_dropped() == 0, "bench messages were dropped"
    return count / (t1 - t0)


async def publish_nodes(settings: BusSettings, nodes: int, rounds: int) -> tuple[float, float]:
    """(samples/s, acked devices events/s): medians of 3 timed rounds each."""
    metrics = BusMetrics()
    names = [f"sim-{i:04d}.cluster.local" for i in range(nodes)]
    samples = [sample_event(n) for n in names]
    async with (
        connection.connect(settings) as conn,
        publishing.publisher(conn, settings=settings, metrics=metrics) as pub,
    ):
        samples_rates = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(rounds):
                for ev in samples:
                    pub.publish(ev)
                await pub.wait_sent()
            await conn.flush()
            samples_rates.append(nodes * rounds / (time.perf_counter() - t0))
        state_rates = []
        for seq in range(3):
            devices = [example_events(n, seq=seq)[0] for n in names]
            t0 = time.perf_counter()
            for dev in devices:
                pub.publish(dev)
            await pub.wait_sent()
            state_rates.append(nodes / (time.perf_counter() - t0))
    return statistics.median(samples_rates), statistics.median(state_rates)


# --- part 3: ``bus watch -o json`` against bare nats-py, both reading the same stream ----------

CLI = str(Path(sys.executable).with_name("gpustack-operator"))
_IDLE_S = 3.0
"""A run ends when its subscriber has written nothing for this long (it dropped the rest)."""


async def bare_sub_process(url: str) -> None:
    """Child process: the bare nats-py peer, writing each payload as a line (``nats sub --raw``).

    Buffered like ours (whatever ``PYTHONUNBUFFERED`` says), flushed when nothing is pending,
    so neither side pays a write per line.
    """
    out = io.BufferedWriter(io.FileIO(sys.stdout.fileno(), "wb", closefd=False))
    nc = await nats.connect(url)
    sub = None

    async def cb(msg: Msg) -> None:
        out.write(msg.data)
        out.write(b"\n")
        if sub is not None and sub.pending_msgs == 0:
            out.flush()

    sub = await nc.subscribe(subjects.filter_for(kind="samples"), cb=cb)
    await nc.flush()
    out.write(b"ready\n")
    out.flush()
    await asyncio.Event().wait()


@dataclass
class LineCount:
    lines: int = 0
    first: float = 0.0
    last: float = 0.0
    cpu_first: float = 0.0
    cpu_last: float = 0.0

    @property
    def rate(self) -> float:
        return (self.lines - 1) / (self.last - self.first) if self.lines > 1 else 0.0

    @property
    def cpu_us(self) -> float:
        """The subscriber's CPU time (user + system) per line, in µs: what a shared machine's
        load does not change much, unlike the rate."""
        return 1e6 * (self.cpu_last - self.cpu_first) / (self.lines - 1) if self.lines > 1 else 0.0


def _cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` has used so far (``/proc/<pid>/stat`` utime + stime)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_lines(fd: int, expected: int, pid: int | None = None) -> LineCount:
    """Read ``fd`` until ``expected`` lines came or, once lines flow, it stayed idle for
    :data:`_IDLE_S` (the publisher is a fresh process: the first line may take seconds)."""
    import selectors

    got = LineCount()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while got.lines < expected and sel.select(_IDLE_S if got.lines else 60.0):
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            now = time.perf_counter()
            cpu = _cpu_s(pid) if pid is not None else 0.0
            if not got.lines:
                got.first, got.cpu_first = now, cpu
            got.lines += chunk.count(b"\n")
            got.last, got.cpu_last = now, cpu
    return got


def _drain(fd: int, quiet_s: float) -> None:
    """Wait for the subscriber's first line (a ready line, retained state), then discard what
    ``fd`` holds until it is quiet."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        if not sel.select(60.0) or not os.read(fd, 1 << 20):
            raise RuntimeError("the subscriber wrote nothing in 60 s")
        while sel.select(quiet_s):
            if not os.read(fd, 1 << 20):
                return


def piped_run(
    argv: list[str], url: str, count: int, env: dict[str, str] | None = None
) -> LineCount:
    """Start the subscriber ``argv``, wait for its first line, publish ``count``, count lines."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    try:
        _drain(fd, 1.0)
        publisher = start_publisher(url, count)
        got = count_lines(fd, count, proc.pid)
        publisher.wait()
    finally:
        proc.stdout.close()  # first: a child blocked writing to a full pipe gets EPIPE
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return got


async def watch_runs(
    server_url: str, count: int, runs: int, before: str | None = None
) -> dict[str, list[float]]:
    """Rates of each subscriber over ``runs`` interleaved runs (peers measured in the same run);
    ``before``: a source tree whose ``bus watch`` runs too (*watch-before*: before/after)."""
    settings = BusSettings(url=server_url)
    async with connection.connect(settings) as conn:
        await state.ensure_streams(conn, settings)  # as a deployment has them: watch reads state
        marker = codec.encode(sample_event("marker.local"))
        await conn.publish_acked(subjects.subject("marker.local", "samples"), marker)
    watch = [CLI, "bus", "watch", "-o", "json", "--nats-url", server_url]
    watch += ["--subject", subjects.filter_for(kind="samples")]
    bare = [sys.executable, __file__, "--bare-sub", server_url]
    subscribers: list[tuple[str, list[str], dict[str, str] | None]] = [
        ("bare-pipe", bare, None),
        ("watch", watch, None),
    ]
    if before is not None:
        subscribers.append(("watch-before", watch, {**os.environ, "PYTHONPATH": before}))
    rates: dict[str, list[float]] = {"bare-count": []}
    for name, _, _ in subscribers:
        rates.update({name: [], f"{name}-cpu": []})
    for _ in range(runs):
        rates["bare-count"].append(await bare_run(server_url, count))
        for name, argv, env in subscribers:
            got = await anyio.to_thread.run_sync(piped_run, argv, server_url, count, env)
            if got.lines < count:
                print(f"  {name}: {count - got.lines} of {count} messages dropped")
            rates[name].append(got.rate)
            rates[f"{name}-cpu"].append(got.cpu_us)
    return rates


def report_watch(rates: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in rates.items()}
    load = os.getloadavg()[0]
    print(f"watch runs: {len(rates['watch'])}, load average {load:.2f} (medians)")
    print(f"bare nats-py, counting      : {med['bare-count']:10,.0f} msg/s")
    print(f"bare nats-py, lines to pipe : {med['bare-pipe']:10,.0f} msg/s")
    print(
        f"bus watch -o json to pipe   : {med['watch']:10,.0f} msg/s"
        f"  ({med['watch'] / med['bare-pipe']:.2f} of bare-pipe,"
        f" {med['watch'] / med['bare-count']:.2f} of bare-count)"
    )
    if "watch-before" in med:
        print(
            f"bus watch, before          : {med['watch-before']:10,.0f} msg/s"
            f"  ({med['watch-before'] / med['bare-pipe']:.2f} of bare-pipe)"
        )
    cpu_bare, cpu_watch = med["bare-pipe-cpu"], med["watch-cpu"]
    print(f"CPU per message, bare-pipe  : {cpu_bare:10.1f} µs")
    print(
        f"CPU per message, bus watch  : {cpu_watch:10.1f} µs"
        f"  (a CPU-bound rate of {cpu_bare / cpu_watch:.2f} of bare-pipe)"
    )
    if "watch-before-cpu" in med:
        cpu_before = med["watch-before-cpu"]
        print(
            f"CPU per message, before     : {cpu_before:10.1f} µs"
            f"  (a CPU-bound rate of {cpu_bare / cpu_before:.2f} of bare-pipe)"
        )


async def main(
    count: int, publish_only: bool, watch_only: bool, runs: int | None, before: str | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with embedded.embedded_server(Path(tmp) / "nats") as server:
            settings = BusSettings(url=server.url)
            size = len(codec.encode(sample_event("node-0.local")))
            print(f"nats-server {server.url}; {count} messages of {size} bytes per run")
            if watch_only:
                runs = runs or (1 if SMOKE else 5)
                report_watch(await watch_runs(server.url, count, runs, before))
                return
            if not publish_only:
                runs = 1 if SMOKE else 3
                bare = max([await bare_run(server.url, count) for _ in range(runs)])
                ours = max([await bus_run(settings, count) for _ in range(runs)])
                print(f"bare nats-py subscriber     : {bare:10,.0f} msg/s")
                print(
                    f"bus.subscribing (decoded)   : {ours:10,.0f} events/s"
                    f"  ({ours / bare:.2f} of bare)"
                )
            nodes, rounds = (50, 2) if SMOKE else (1000, 20)
            samples_rate, state_rate = await publish_nodes(settings, nodes, rounds)
            print(f"publish samples, {nodes} nodes : {samples_rate:10,.0f} events/s")
            print(f"publish devices (acked)     : {state_rate:10,.0f} events/s")
            if not publish_only:
                runs = runs or (1 if SMOKE else 3)
                report_watch(await watch_runs(server.url, count, runs, before))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2_000 if SMOKE else 100_000)
    parser.add_argument("--publisher", metavar="URL")
    parser.add_argument("--bare-sub", metavar="URL")
    parser.add_argument("--publish-only", action="store_true")
    parser.add_argument("--watch-only", action="store_true")
    parser.add_argument("--runs", type=int, help="watch runs (default 5 with --watch-only, else 3)")
    parser.add_argument(
        "--watch-before", metavar="SRC", help="also run the `bus watch` of this source tree"
    )
    args = parser.parse_args()
    if args.publisher:
        anyio.run(publisher_process, args.publisher, args.messages)
    elif args.bare_sub:
        anyio.run(bare_sub_process, args.bare_sub)
    else:
        anyio.run(
            main, args.messages, args.publish_only, args.watch_only, args.runs, args.watch_before
        )

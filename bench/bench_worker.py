"""Worker benchmark: ingest and event-to-object latency for N simulated nodes x 8 GPUs.

Run: ``.venv/bin/python bench/bench_worker.py --nodes 1000 --period 1 --seconds 30 --sink kv api``;
``--chain --nodes 1000`` measures the scheduling chain's reconcile passes instead (see
:func:`chain_bench`), ``--ingest --nodes 2000 10000`` the ingest path's CPU per event alone
(see :func:`ingest_bench`).

Every part is its own process, so none steals the worker's event loop and the worker's CPU
seconds and RSS are its own: a nats-server, the worker, ``--publishers`` publisher processes
(each plays a slice of the nodes) and, for ``--sink api``, the stateful fake Kubernetes API of
the tests (``tests/controlplane/controlplane_fakeapi.py``, with every node's Node object).

Each node publishes every ``--period`` a ``samples`` event (8 accelerators) and its ``devices``
event (an unchanged spec after the first round: folded, no write); ``--change`` of the nodes also
publish an allocation that flips (allocated/released), which changes ``Devices.status``. Nodes
are spread evenly over the period (independent agents), or all at once with ``--burst``.

Event-to-object latency is what the issue means: from the event's ``ts``, stamped when the
publisher sends it, to the end of the reconcile that wrote the objects reflecting it
(``gpustack_worker_event_to_object_seconds``, interpolated inside its buckets the way
``histogram_quantile`` does). That metric counts one event per reconcile (the oldest one that
changed the node), a few percent of what is consumed, so the bench also measures **every**
consumed event (``all_p50_s``/``all_p99_s``): the worker child wraps the ledger's fold and the
node reconcile (bench-only instrumentation, served on its own port), and an event's latency ends
when it is folded if it changes nothing (the objects already reflect it), else when the first
reconcile that started after its fold ends. Two phases, each measured from ``/metrics``
differences:

- *cold*: the first round, which creates every node's objects; the bench waits until the worker
  has drained it;
- *steady*: the rounds after it, for ``--seconds``.

Also: events/s consumed, writes per node per minute (KV ``kv_put``/``kv_delete``, or API
``create``/``patch``/``update``/``delete``), the worker's CPU share of one core, its CPU per
consumed event (less sensitive to a loaded machine than latencies), the share of it spent in the
garbage collector, and its RSS. The publishers pre-encode every node's events once and only put
the send stamp in (:func:`node_templates`), sending in slots of the period; the bench reports
what they offered (``offered_per_s``) and how far the worst one fell behind its schedule
(``publisher_lag_s``): a run whose publishers lag is not a valid measure of the worker.

With ``--sink api`` the worker has a Kubernetes API, so its scheduling chain (Kueue objects,
node fit labels) runs too, against the fake API.

The worker runs with the production settings unless a flag says otherwise: the API client's
QPS and burst are the command's ``--kube-conn-qps``/``--kube-conn-burst`` defaults, the resync
period the worker's own (60 s); ``--kube-qps``, ``--kube-burst`` and ``--resync-s`` change them,
and the first line printed says which values ran and where each came from. The worker's (and
nats-server's) CPU share is over the load window only, from the first steady event sent to the
last; the CPU per event also counts the drain after it. The bench's histogram of every consumed
event has buckets 25 % apart (1 ms to 120 s), so its quantiles are within about 12 %.

``--profile out`` runs the worker under pyinstrument (a bench-only dependency) and writes
``out.html`` and ``out.txt``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families

from bus import codec, connection, embedded, events, subjects
from bus.devices import (
    Accelerator,
    AcceleratorSample,
    AcceleratorStatus,
    DeviceGroup,
    MonitorSample,
)
from bus.settings import BusSettings
from controlplane.chain.naming import NAMESPACES as NAMESPACES_RESOURCE
from kit.serving import HttpsSettings

Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]
LATENCY = "gpustack_worker_event_to_object_seconds"
API_WRITES = ("create", "patch", "update", "delete")
KV_WRITES = ("kv_put", "kv_delete")
# ``BENCH_SMOKE=1`` (``just bench-smoke``, run by CI): tiny sizes, seconds in all, to prove the
# bench still runs; its figures mean nothing.
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")


def node_names(n: int) -> list[str]:
    return [f"node-{i:05d}.cluster.local" for i in range(n)]


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


# --- child processes -------------------------------------------------------------------------


ALL_LATENCY = "bench_worker_consumed_event_to_object_seconds"
BOUNDS = [round(0.001 * 1.25**i, 6) for i in range(53)]
"""The bench's histogram: 1 ms to 120 s in steps of 25 %, so an interpolated quantile is within
about 12 % (doubling buckets could not tell 0.26 s from 0.5 s: both fell in 0.256-0.512)."""
GC_SECONDS = "bench_worker_gc_seconds"


def instrument(port: int) -> None:
    """Measure every consumed event's latency in this (worker) process; serve it on ``port``.

    Wraps :meth:`Ledger.apply` and :meth:`NodeReconciler.reconcile` at class level: bench-only,
    so production code carries no per-event bookkeeping for it.
    """
    import bisect
    import collections

    from prometheus_client import CollectorRegistry, Counter, start_http_server
    from prometheus_client.core import HistogramMetricFamily

    from controlplane.reconciling.nodes import NodeReconciler
    from controlplane.reconciling.nodestates import Ledger

    class Hist:
        """A histogram without a lock or label lookups: it runs for every event, in the
        worker's process, so it must cost next to nothing beside what it measures."""

        def __init__(self, bounds: list[float]) -> None:
            self.bounds, self.counts, self.sum = bounds, [0] * (len(bounds) + 1), 0.0

        def observe(self, value: float) -> None:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value

        def collect(self) -> list[HistogramMetricFamily]:
            les = [*map(str, self.bounds), "+Inf"]
            cumulative = list(itertools.accumulate(self.counts))
            return [HistogramMetricFamily(
                ALL_LATENCY, "every consumed event", buckets=list(zip(les, cumulative, strict=True)),
                sum_value=self.sum,
            )]  # fmt: skip

    registry = CollectorRegistry()
    hist = Hist(BOUNDS)
    registry.register(hist)
    gc_seconds = Counter(
        GC_SECONDS, "time in the garbage collector", ["generation"], registry=registry
    )
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.process_time()
        else:
            gc_seconds.labels(generation=str(info["generation"])).inc(
                time.process_time() - gc_started[0]
            )

    gc.callbacks.append(on_gc)
    pending: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
    apply, reconcile = Ledger.apply, NodeReconciler.reconcile

    def applying(self: Ledger, event: events.Event) -> bool:
        changed = apply(self, event)
        if changed:
            pending[event.node].append(event.ts.timestamp())
        else:
            hist.observe(max(0.0, time.time() - event.ts.timestamp()))
        return changed

    async def reconciling(self: NodeReconciler, node: str) -> None:
        waiting = pending.get(node)
        taken = len(waiting) if waiting else 0
        await reconcile(self, node)
        now = time.time()
        for _ in range(taken):
            hist.observe(max(0.0, now - pending[node].popleft()))

    Ledger.apply = applying  # type: ignore[method-assign]
    NodeReconciler.reconcile = reconciling  # type: ignore[method-assign]
    start_http_server(port, addr="127.0.0.1", registry=registry)


def worker_child(args: argparse.Namespace) -> None:
    """The worker (KV sink, or the fake API at ``--api``) until SIGTERM."""
    from controlplane.k8s.client import KubeSettings
    from controlplane.worker import running
    from controlplane.worker.settings import WorkerFlags, reconcile_concurrency
    from gpustack_operator.main import options_for

    instrument(args.all_port)

    flags = options_for(("worker",)).read_flags(WorkerFlags)
    kube = KubeSettings(
        host=args.api, qps=args.kube_qps, burst=args.kube_burst,
        timeout_s=flags.kube_conn_timeout, relist_s=flags.informer_cache_resync_period,
    )  # fmt: skip
    settings = running.WorkerSettings(
        # As the command runs it: --gopool-worker-factor (its default) reconciles per core.
        concurrency=reconcile_concurrency(flags.gopool_worker_factor),
        # Short reconnect waits, but the default bound on a request, as the worker runs.
        bus=BusSettings.for_tests(args.url, request_timeout_s=BusSettings().request_timeout_s),
        kube=kube if args.api else None,
        https=HttpsSettings(bind_address="127.0.0.1", port=args.port, auth="none"),
        resync_s=args.resync_s,
    )

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001)
        profiler.start()
    try:
        anyio.run(running.run, settings)
    except KeyboardInterrupt:
        pass
    finally:
        if profiler is not None:
            profiler.stop()
            Path(f"{args.profile}.html").write_text(profiler.output_html())
            Path(f"{args.profile}.txt").write_text(profiler.output_text(show_all=False))


def fakeapi_child(args: argparse.Namespace) -> None:
    """The tests' stateful fake API on ``--port`` with a Node object for every node."""
    sys.path.insert(0, str(ROOT / "tests" / "controlplane"))
    from aiohttp import web
    from controlplane_fakeapi import FakeApi, node  # type: ignore[import-not-found]

    fake = FakeApi()
    for name in node_names(args.nodes):
        fake.put_object("api/v1/nodes", node(name))
    app = web.Application()

    async def node_requests(_request: web.Request) -> web.Response:
        return web.json_response(node_request_kinds(fake.paths))

    app.router.add_get("/_bench/node-requests", node_requests)
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


NODE_KINDS = ("nodes", "devices", "nodemodelstores")


def node_request_kinds(paths: dict[tuple[str, str], int]) -> dict[str, int]:
    """The fake API's requests on a node's objects by kind: ``PATCH devices/status``, ``POST
    devices``, ``GET nodes`` (a named get; lists and watches of the collection are not
    counted)."""
    out: dict[str, int] = {}
    for (method, path), count in paths.items():
        parts = path.strip("/").split("/")
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if not rest or rest[0] not in NODE_KINDS or (method == "GET" and len(rest) == 1):
            continue
        kind = f"{method} {rest[0]}" + ("/status" if rest[-1] == "status" else "")
        out[kind] = out.get(kind, 0) + count
    return out


def api_node_requests(api_url: str | None) -> dict[str, int]:
    if api_url is None:
        return {}
    with urllib.request.urlopen(f"{api_url}/_bench/node-requests", timeout=10) as r:
        return dict(json.loads(r.read()))


Template = tuple[bytes, bytes]
"""An event's wire form cut around its stamp: everything before the stamp, everything after."""


def template(event: events.Event) -> Template:
    """``event`` encoded once; :func:`stamped` puts a new ``ts`` in for each send."""
    data = codec.encode(event)
    start = data.index(b'"ts":"') + len(b'"ts":"')
    return data[:start], data[data.index(b'"', start) :]


def stamped(t: Template, stamp: bytes) -> bytes:
    return t[0] + stamp + t[1]


def node_templates(node: str, period_s: float) -> dict[str, Template]:
    """A node's events, pre-encoded: samples, devices, and its allocation made and released."""
    alloc = {
        action: template(events.AllocationEvent(
            node=node, allocation_id="pod/c", action=action, resource="nvidia.com/gpu",
            device_ids=(f"nvidia-h200:GPU-{node}-0:0",),
        ))
        for action in ("allocated", "released")
    }  # fmt: skip
    return {
        "samples": template(samples(node, period_s)),
        "devices": template(events.DevicesEvent(node=node, groups=groups(node))),
        **alloc,
    }


async def publisher_child(args: argparse.Namespace) -> None:
    """Publish nodes ``part::parts`` for rounds ``first..first+rounds-1``; print the count and
    how late the publisher was at worst (seconds behind its schedule).

    Every event is pre-encoded once per node (:func:`node_templates`); a send only puts the
    current stamp in. Nodes are published in slots of ``period / 200`` (at least 5 ms): the nodes
    whose phase falls in a slot go out together, stamped when the slot is actually sent.
    """
    nodes = node_names(args.nodes)
    mine = list(range(args.part, len(nodes), args.parts))
    flip = max(1, int(len(nodes) * args.change))
    tpl = {i: node_templates(nodes[i], args.period) for i in mine}
    subj = {i: {k: subjects.subject(nodes[i], k) for k in ("samples", "devices", "allocations")}
            for i in mine}  # fmt: skip
    slots = 1 if args.burst else max(1, min(200, int(args.period / 0.005)))
    by_slot: list[list[int]] = [[] for _ in range(slots)]
    for i in mine:
        by_slot[i * slots // len(nodes)].append(i)
    sent, lag = 0, 0.0
    async with connection.connect(BusSettings.for_tests(args.url), name="agents") as conn:
        await anyio.sleep(max(0.0, args.start - time.time()))
        for rnd in range(args.first, args.first + args.rounds):
            began = args.start + (rnd - args.first) * args.period
            action = "allocated" if rnd % 2 == 0 else "released"
            for k, due in enumerate(by_slot):
                late = time.time() - (began + args.period * k / slots)
                if late < 0:
                    await anyio.sleep(-late)
                lag = max(lag, late)
                stamp = msgspec.json.encode(datetime.now(UTC))[1:-1]  # when actually sent
                for i in due:
                    t, s = tpl[i], subj[i]
                    await conn.publish(s["samples"], stamped(t["samples"], stamp))
                    await conn.publish(s["devices"], stamped(t["devices"], stamp))
                    sent += 2
                    if (i + rnd) % len(nodes) < flip:
                        await conn.publish(s["allocations"], stamped(t[action], stamp))
                        sent += 1
            await conn.flush()
            await anyio.sleep(max(0.0, began + args.period - time.time()))
    print(sent, round(lag, 3), flush=True)


# --- measuring -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int, all_port: int = 0) -> Metrics:
    """The worker's ``/metrics`` (and, with ``all_port``, the bench's own latency of all)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx) as r:
        text = r.read().decode()
    if all_port:
        with urllib.request.urlopen(f"http://127.0.0.1:{all_port}/metrics") as r:
            text += r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def total(m: Metrics, name: str, **want: str) -> float:
    return sum(
        v for (n, labels), v in m.items()
        if n == name and all(dict(labels).get(k) == x for k, x in want.items())
    )  # fmt: skip


def quantile(m1: Metrics, m0: Metrics, name: str, q: float) -> float:
    """``histogram_quantile`` over the increase of histogram ``name`` from ``m0`` to ``m1``."""
    buckets = sorted(
        (float(dict(labels)["le"]), v - m0.get((n, labels), 0.0))
        for (n, labels), v in m1.items()
        if n == f"{name}_bucket"
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
    """(CPU seconds, RSS bytes) of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(
        int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu, rss


QUIET_S = 4.0
"""No event reconciled and no write to a node's objects for this long (more than the chain's
3 s between passes): the worker is done, the scheduling chain's label patches included."""


async def drained(
    port: int, all_port: int, api_url: str | None, timeout_s: float = 600.0
) -> tuple[Metrics, float]:
    """Wait until the queue is empty and neither the latency count nor the fake API's writes to
    node objects moved for :data:`QUIET_S` (reads do not count: a resync's gets of every Node
    in the old code would never leave it quiet); the last scrape, and when the last of them
    moved (monotonic)."""
    last: tuple[float, int] = (-1.0, -1)
    moved = time.monotonic()
    deadline = moved + timeout_s
    while time.monotonic() < deadline:
        await anyio.sleep(0.5)
        m = scrape(port, all_port)
        wrote = api_node_requests(api_url)
        now = (total(m, f"{LATENCY}_count"), sum(v for k, v in wrote.items() if k[:4] != "GET "))
        if now != last:
            last, moved = now, time.monotonic()
        quiet = time.monotonic() - moved >= QUIET_S
        if total(m, "gpustack_worker_queue_depth") == 0 and now[0] > 0 and quiet:
            return m, moved
    raise TimeoutError("the worker did not drain")


async def run_publishers(
    args: argparse.Namespace, url: str, *, first: int, rounds: int
) -> tuple[int, float]:
    """Run the publisher processes for ``rounds``; (events sent, the worst publisher's lag
    behind its schedule in seconds)."""
    start = time.time() + 2.0 + args.n / 5000  # every publisher ready before the first round
    procs = []
    for k in range(args.publishers):
        cmd = [
            sys.executable, __file__, "--role", "publish", "--url", url,
            "--nodes", str(args.n), "--part", str(k), "--parts", str(args.publishers),
            "--first", str(first), "--rounds", str(rounds), "--period", str(args.period_s),
            "--change", str(args.change), "--start", str(start),
            *(["--burst"] if args.burst else []),
        ]  # fmt: skip
        procs.append(await anyio.open_process(cmd))
    sent, lag = 0, 0.0
    for p in procs:
        assert p.stdout is not None
        out = b"".join([chunk async for chunk in p.stdout]).decode().split()
        await p.wait()
        sent += int(out[0]) if out else 0
        lag = max(lag, float(out[1]) if len(out) > 1 else 0.0)
    return sent, lag


def phase(
    m1: Metrics, m0: Metrics, n: int, elapsed: float, writes: Sequence[str]
) -> dict[str, Any]:
    consumed = total(m1, "gpustack_worker_events_consumed_total") - total(
        m0, "gpustack_worker_events_consumed_total"
    )
    wrote = sum(
        total(m1, "gpustack_worker_api_requests_total", verb=v)
        - total(m0, "gpustack_worker_api_requests_total", verb=v)
        for v in writes
    )
    return {
        "consumed": int(consumed),
        "events_per_s": round(consumed / elapsed, 1),
        "p50_s": round(quantile(m1, m0, LATENCY, 0.5), 3),
        "p99_s": round(quantile(m1, m0, LATENCY, 0.99), 3),
        "all_p50_s": round(quantile(m1, m0, ALL_LATENCY, 0.5), 3),
        "all_p99_s": round(quantile(m1, m0, ALL_LATENCY, 0.99), 3),
        "all_count": int(total(m1, f"{ALL_LATENCY}_count") - total(m0, f"{ALL_LATENCY}_count")),
        "latencies": int(total(m1, f"{LATENCY}_count") - total(m0, f"{LATENCY}_count")),
        "writes": int(wrote),
        "writes_per_node": round(wrote / n, 2),
        # Every GET the worker sent (gets, lists and watch starts; API sink only).
        "reads": int(
            total(m1, "gpustack_worker_api_requests_total", verb="get")
            - total(m0, "gpustack_worker_api_requests_total", verb="get")
        ),
        "seconds": round(elapsed, 1),
        # Refused on receipt, "overflow" included: the worker fell so far behind that its
        # buffer filled. Any is a failed run.
        "dropped": int(
            total(m1, "gpustack_bus_dropped_messages_total")
            - total(m0, "gpustack_bus_dropped_messages_total")
        ),
        "writes_per_node_min": round(wrote / n / (elapsed / 60), 2),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with embedded.embedded_server(Path(tmp) / "nats") as server:
            children: list[subprocess.Popen[bytes]] = []
            try:
                worker_cmd = [sys.executable, __file__, "--role", "worker", "--url", server.url]
                api_url = None
                if args.sink == "api":
                    api_port = free_port()
                    children.append(subprocess.Popen([  # noqa: ASYNC220 (a bench)
                        sys.executable, __file__, "--role", "fakeapi", "--port", str(api_port),
                        "--nodes", str(args.n),
                    ]))  # fmt: skip
                    api_url = f"http://127.0.0.1:{api_port}"
                    worker_cmd += ["--api", api_url]
                port, all_port = free_port(), free_port()
                worker_cmd += ["--port", str(port), "--all-port", str(all_port)]
                if args.profile:
                    worker_cmd += ["--profile", f"{args.profile}-{args.sink}-{args.n}"]
                worker_cmd += ["--kube-qps", str(args.kube_qps)]
                worker_cmd += ["--kube-burst", str(args.kube_burst)]
                worker_cmd += ["--resync-s", str(args.resync_s)]
                worker = subprocess.Popen(worker_cmd)  # noqa: ASYNC220 (a bench)
                children.append(worker)
                for _ in range(600):
                    try:
                        scrape(port)
                        break
                    except OSError:
                        await anyio.sleep(0.1)
                server_pid = server._proc.pid if server._proc else 0  # its CPU is reported
                return await measure(
                    args, server.url, (port, all_port), (worker.pid, server_pid), api_url
                )
            finally:
                # Before the server stops, so that no child sees its bus go away. The worker
                # first (it writes its profile), then the fake API.
                for child in reversed(children):
                    child.send_signal(signal.SIGTERM if child is children[-1] else signal.SIGKILL)
                    try:
                        child.wait(60)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()


async def measure(
    args: argparse.Namespace,
    url: str,
    ports: tuple[int, int],
    pids: tuple[int, int],
    api_url: str | None,
) -> dict[str, Any]:
    """Both phases; ``pids``: the worker's and nats-server's (whose CPU is reported too: with
    the publishers, the bench itself needs more than the worker's core)."""
    pid, server_pid = pids
    writes = API_WRITES if args.sink == "api" else KV_WRITES
    load0 = os.getloadavg()[0]
    _, rss0 = proc_usage(pid)
    m0, r0 = scrape(*ports), api_node_requests(api_url)
    t0 = time.monotonic()
    sent0, lag0 = await run_publishers(args, url, first=0, rounds=1)
    m1, converged = await drained(*ports, api_url)
    r1 = api_node_requests(api_url)
    cold_s = converged - t0  # to the last write of the round, the chain's included
    cpu1, _ = proc_usage(pid)
    server1, _ = proc_usage(server_pid)
    t1 = time.monotonic()
    rounds = max(1, round(args.seconds / args.period_s))
    sent1, lag1 = await run_publishers(args, url, first=1, rounds=rounds)
    # The load window ends when the publishers stop: CPU shares are over it alone, not over
    # the wait for the worker to drain (idle at the end, which would dilute them).
    load_s = time.monotonic() - t1
    cpu_loaded, _ = proc_usage(pid)
    server_loaded, _ = proc_usage(server_pid)
    m2, _ = await drained(*ports, api_url)
    steady_s = time.monotonic() - t1
    cpu2, rss = proc_usage(pid)
    steady = phase(m2, m1, args.n, steady_s, writes)
    return {
        "nodes": args.n,
        "period_s": args.period_s,
        "sink": args.sink,
        "publishers": args.publishers,
        "burst": args.burst,
        "published": sent0 + sent1,
        # What the publishers offered on their schedule, and how late the worst one fell.
        "offered_per_s": round(sent1 / (rounds * args.period_s), 1),
        "publisher_lag_s": {"cold": lag0, "steady": lag1},
        "cold": phase(m1, m0, args.n, cold_s, writes),
        # The fake API's count of each kind of request on node objects in the cold round, per
        # node (lists and watches apart): what a new node costs.
        "cold_node_requests_per_node": {
            k: round((v - r0.get(k, 0)) / args.n, 3) for k, v in sorted(r1.items())
        },
        "steady": steady,
        "steady_s": round(steady_s, 1),
        "load_s": round(load_s, 1),
        "worker_cpu_pct": round(100 * (cpu_loaded - cpu1) / load_s, 1),
        # Less sensitive to a loaded machine than latencies: the worker's CPU per event (the
        # drain included: it is work for those events).
        "worker_cpu_us_per_event": round(1e6 * (cpu2 - cpu1) / max(1, steady["consumed"]), 1),
        "server_cpu_pct": round(100 * (server_loaded - server1) / load_s, 1),
        "worker_gc_pct": round(
            100 * (total(m2, f"{GC_SECONDS}_total") - total(m1, f"{GC_SECONDS}_total")) / steady_s,
            1,
        ),
        "worker_rss_mib": round(rss / 2**20, 1),
        "worker_rss_idle_mib": round(rss0 / 2**20, 1),
        "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "rejected": total(m2, "gpustack_worker_events_rejected_total"),
    }


# --- the ingest path alone (``--ingest``) -----------------------------------------------------


def ingest_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The worker's own CPU per event on its ingest path, in this process, without I/O: the
    bus guard (subject, decode or recall, clock), the latest samples and the processor's fold
    (counter, ledger, queue), for ``args.n`` nodes publishing as the scale runs do. Less
    sensitive to a loaded machine than the full runs (process time, one process), it leaves
    out what the full runs add: the NATS client, the event loop and the reconciles."""
    from bus import state
    from bus.metrics import BusMetrics
    from controlplane.extension.registration import LatestSamples
    from controlplane.metrics import WorkerMetrics
    from controlplane.reconciling.nodes import NodeReconciler
    from controlplane.reconciling.nodestates import Ledger
    from controlplane.reconciling.processing import Processor
    from controlplane.reconciling.queueing import AsyncKeyQueue
    from controlplane.reconciling.sinks import KvSink
    from controlplane.worker import running

    metrics = WorkerMetrics()
    guard = state.guard_for(
        BusSettings(url="nats://unused"), BusMetrics(metrics.registry),
        memo_kinds=codec.REPEATED_KINDS,
    )  # fmt: skip
    ledger = Ledger(max_nodes=args.n + 1)
    processor = Processor(
        ledger=ledger, sink=KvSink(None), metrics=metrics,  # type: ignore[arg-type]
        reconciler=NodeReconciler(ledger=ledger, sink=KvSink(None), metrics=metrics),  # type: ignore[arg-type]
        queue=AsyncKeyQueue(args.n + 1),
    )  # fmt: skip
    latest = LatestSamples(max_nodes=args.n + 1)
    names = node_names(args.n)
    tpl = [node_templates(n, args.period_s) for n in names]
    flip = max(1, int(args.n * args.change))

    def round_of(rnd: int) -> list[tuple[str, bytes]]:
        stamp = msgspec.json.encode(datetime.now(UTC))[1:-1]
        out = []
        for i, n in enumerate(names):
            out += [
                (subjects.subject(n, k), stamped(tpl[i][k], stamp)) for k in ("samples", "devices")
            ]
            if (i + rnd) % args.n < flip:
                action = "allocated" if rnd % 2 == 0 else "released"
                out.append((subjects.subject(n, "allocations"), stamped(tpl[i][action], stamp)))
        return out

    def feed(batch: list[tuple[str, bytes]]) -> None:
        for subj, data in batch:
            event = guard.accept(subj, data)
            if event is not None:
                latest.record(event)
                processor.ingest(running._managed(event, ()))
        while processor.queue.state.take() is not None:  # nobody reconciles here
            pass

    feed(round_of(0))  # the cold round: every node new
    rounds = [round_of(r) for r in range(1, 6)]
    count, start = sum(map(len, rounds)), time.process_time()
    for batch in rounds:
        feed(batch)
    spent = time.process_time() - start
    return {"nodes": args.n, "events": count, "cpu_us_per_event": round(1e6 * spent / count, 1)}


# --- the scheduling chain (``--chain``) ------------------------------------------------------


async def chain_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The chain's reconcile cost at ``args.n`` nodes, in this process, against the fake API in
    its own process: a cold pass (every object created), the pass after it (the queues take
    the now Active check), an idle pass (nothing changed: no write), a pass after ``--change``
    of the nodes got an allocation, the periodic full pass (nothing changed), and the pure plan
    alone."""
    from collections import Counter

    from controlplane.chain.reconciler import ChainReconciler
    from controlplane.chain.settings import ChainSettings
    from controlplane.k8s.client import KubeSettings, open_client
    from controlplane.k8s.informing import Informer
    from controlplane.reconciling.nodestates import Ledger
    from controlplane.resources import NODES

    api_port = free_port()
    child = subprocess.Popen([  # noqa: ASYNC220 (a bench)
        sys.executable, __file__, "--role", "fakeapi", "--port", str(api_port),
        "--nodes", str(args.n),
    ])  # fmt: skip
    requests: Counter[str] = Counter()
    try:
        ledger = Ledger(max_nodes=args.n + 1)
        names = node_names(args.n)
        for name in names:
            ledger.apply(events.DevicesEvent(node=name, groups=groups(name)))
        settings = KubeSettings.for_tests(f"http://127.0.0.1:{api_port}", qps=1e6, burst=1_000_000)
        observe = lambda verb, result: requests.update([verb])
        async with open_client(settings, observe=observe) as api, anyio.create_task_group() as tg:
            await _namespaces(api)
            nodes = Informer(api, NODES)
            chain = ChainReconciler(api=api, ledger=ledger, nodes=nodes, settings=ChainSettings())
            tg.start_soon(nodes.run)
            await nodes.ready.wait()

            async def one() -> dict[str, float]:
                # the watch's echoes of the last pass's writes, decoded on this loop, done first
                # (in the worker the same watch ran before the informer too)
                await anyio.sleep(min(5.0, 0.0005 * args.n))
                requests.clear()
                start = time.perf_counter()
                await chain.reconcile()
                writes = sum(requests[v] for v in API_WRITES)
                return {"seconds": round(time.perf_counter() - start, 3), "writes": writes}

            out: dict[str, Any] = {"nodes": args.n, "cold": await one()}
            out["settle"] = await one()  # the checks are Active now: the queues list them
            out["idle"] = await one()
            changed = names[: max(1, int(len(names) * args.change))]
            for name in changed:
                g = groups(name)[0]
                ledger.apply(events.AllocationEvent(
                    node=name, allocation_id=f"{name}/p", action="allocated",
                    resource="nvidia.com/gpu", device_ids=(f"{g.id}:{g.accelerators[0].id}:0000",),
                ))  # fmt: skip
                chain.state_changed(name)  # what the processor's fold tells the chain
            out["changed"] = {**await one(), "nodes_changed": len(changed)}
            chain.retune(msgspec.structs.replace(chain.settings, period_s=0.0))
            periods = [await one() for _ in range(3)]  # the periodic full pass, best of three
            out["period"] = min(periods, key=lambda p: p["seconds"])
            out["plan_seconds"] = _plan_seconds(ledger, names)
            tg.cancel_scope.cancel()
            return out
    finally:
        child.kill()  # its state is of no use; a SIGTERM would wait for the informer's watch
        child.wait()


def _plan_seconds(ledger: Any, names: Sequence[str]) -> float:
    """The pure plan alone, for every node."""
    from controlplane.chain.inventory import facts_of
    from controlplane.chain.kueue import plan_chain
    from controlplane.chain.settings import ChainSettings

    facts = [facts_of(b, ledger.get(b["metadata"]["name"])) for b in chain_nodes(names)]
    start = time.perf_counter()
    plan_chain(
        facts, allocations={}, namespaces=[f"team-{i}" for i in range(10)],
        instance_types={}, cluster_queues={}, active_checks=[], settings=ChainSettings(),
    )  # fmt: skip
    return round(time.perf_counter() - start, 3)


async def _namespaces(api: Any) -> None:
    """Wait for the fake API child to answer, then make the ten team namespaces."""
    from controlplane.resources import Ref

    for _ in range(600):
        try:
            await api.list(NAMESPACES_RESOURCE)
            break
        except Exception:  # noqa: BLE001 (the child is starting)
            await anyio.sleep(0.1)
    for i in range(10):
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"team-{i}"}}
        await api.create(Ref(resource=NAMESPACES_RESOURCE, name=f"team-{i}"), ns)


def chain_nodes(names: Sequence[str]) -> list[dict[str, Any]]:
    return [
        {"metadata": {"name": n, "labels": {"gpustack.ai/managed": "true"}},
         "status": {"capacity": {"cpu": "8"}}}
        for n in names
    ]  # fmt: skip


def child(args: argparse.Namespace) -> None:
    """One of the bench's child processes (``--role``)."""
    if args.role == "worker":
        return worker_child(args)
    if args.role == "fakeapi":
        args.nodes = args.nodes[0]
        return fakeapi_child(args)
    args.nodes, args.period = args.nodes[0], args.period[0]
    return anyio.run(publisher_child, args)


def settings_in_use(args: argparse.Namespace) -> dict[str, Any]:
    """Fill the worker's QPS, burst and resync from the command's own defaults where no flag
    set them, and say which: a figure is only comparable under the settings it ran with."""
    from controlplane.worker.running import WorkerSettings
    from controlplane.worker.settings import WorkerFlags
    from gpustack_operator.main import options_for

    deployed = options_for(("worker",)).read_flags(WorkerFlags)
    given = {"kube_qps": args.kube_qps, "kube_burst": args.kube_burst, "resync_s": args.resync_s}
    defaults = {
        "kube_qps": deployed.kube_conn_qps,
        "kube_burst": deployed.kube_conn_burst,
        # The struct's default, which the command keeps (no flag sets it).
        "resync_s": WorkerSettings.__struct_defaults__[
            WorkerSettings.__struct_fields__.index("resync_s")
            - (len(WorkerSettings.__struct_fields__) - len(WorkerSettings.__struct_defaults__))
        ],
    }
    out = {}
    for name, value in given.items():
        setattr(args, name, defaults[name] if value is None else value)
        out[name] = f"{getattr(args, name)} ({'default' if value is None else 'flag'})"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[20] if SMOKE else [1000])
    p.add_argument("--period", type=float, nargs="+", default=[1.0] if SMOKE else [1.0, 15.0])
    p.add_argument("--sink", nargs="+", choices=["kv", "api"], default=["kv", "api"])
    p.add_argument("--seconds", type=float, default=1.0 if SMOKE else 30.0, help="steady-state")
    p.add_argument("--change", type=float, default=0.05, help="nodes whose status flips a round")
    p.add_argument("--publishers", type=int, default=1 if SMOKE else 2)
    p.add_argument("--burst", action="store_true", help="every node publishes at once")
    p.add_argument("--profile", default="", help="pyinstrument output prefix")
    p.add_argument("--chain", action="store_true", help="the scheduling chain's reconcile cost")
    p.add_argument("--ingest", action="store_true", help="the ingest path's CPU per event alone")
    p.add_argument(
        "--kube-qps", type=float, default=None,
        help="the worker's API client rate (default: the command's --kube-conn-qps default)",
    )  # fmt: skip
    p.add_argument(
        "--kube-burst", type=int, default=None,
        help="the worker's API client burst (default: the command's --kube-conn-burst default)",
    )  # fmt: skip
    p.add_argument(
        "--resync-s", type=float, default=None,
        help="the worker's resync period (default: the worker's own, as deployed)",
    )  # fmt: skip
    p.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    for flag in ("--url", "--api"):
        p.add_argument(flag, default="", help=argparse.SUPPRESS)
    for flag in ("--port", "--all-port", "--part", "--parts", "--first", "--rounds"):
        p.add_argument(flag, type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--start", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role != "bench":
        return child(args)
    print(json.dumps({"settings": settings_in_use(args)}), flush=True)
    if args.ingest:
        for n in args.nodes:
            run = argparse.Namespace(**vars(args), n=n, period_s=args.period[0])
            print(json.dumps(ingest_bench(run)), flush=True)
        return
    if args.chain:
        for n in args.nodes:
            run = argparse.Namespace(**vars(args), n=n)
            print(json.dumps(anyio.run(chain_bench, run)), flush=True)
        return
    for period in args.period:
        for sink in args.sink:
            for n in args.nodes:
                run = argparse.Namespace(**vars(args), n=n, period_s=period)
                run.sink = sink
                print(json.dumps(anyio.run(bench, run)), flush=True)


if __name__ == "__main__":
    main()

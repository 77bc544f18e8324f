"""Device-plugin benchmarks: Allocate latency over the unix socket, health-to-ListAndWatch time.

Run: ``.venv/bin/python bench/bench_deviceplugin.py [--calls N] [--client process|thread]
[--gc-freeze]``. The machine's load moves every figure: run it three times, report medians and
the load average it prints.
Simulates 8×H200, serves the device plugins in a temporary directory (no kubelet needed:
sockets are bound on the first update) and drives them with grpcio, the C-core client closest
to kubelet's grpc-go.

1. Allocate: N sliced allocations of distinct tokens (each charges the ledger and publishes an
   event; the first on each card also makes its tokens of the other modes Unhealthy, so those
   lists are re-sent), one grpcio call at a time on one channel, while a ListAndWatch stream is
   open on every server, as kubelet keeps them. p50/p99/max per call; target p99 < 5 ms.
   The client runs in its own process by default, as kubelet does; ``--client thread`` runs it
   in a thread of the serving process (it then competes with the server for the GIL). Also
   printed: the serving event loop's CPU time per call, which machine load does not inflate
   as much as wall time, and the load average, which does. ``--gc-freeze`` runs
   ``gc.freeze()`` before this phase, as a composition root may after startup: the one full
   collection the run otherwise meets (15-30 ms over every object of the process) leaves max.
2. Health: flip one card unhealthy/healthy through ``Plugins.update`` with a ListAndWatch
   reader (a thread of this process) on every server; time until the exclusive list shows the
   new health, and until every list holding one of the card's tokens was re-sent (5,208
   devices in all). p50/max over the flips.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import gc
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
import grpc
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.deviceplugin.running import Plugins, device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from agent.devices import detection, sources
from agent.devices.settings import DetectSettings
from bus import devices
from proto.deviceplugin import v1beta1 as dp

# ``BENCH_SMOKE=1`` (``just bench-smoke``, run by CI): tiny sizes, seconds in all, to prove the
# bench still runs; its figures mean nothing.
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")
SERVERS = ("exclusive", "shared", "sliced", "partitioned", "visibility")


def groups_h200() -> list[devices.DeviceGroup]:
    settings = DetectSettings(manufacturers=("nvidia",), simulate="nvidia-h200x8")
    with sources.open_backends(settings) as backends:
        return detection.detect(backends).items


def with_health(groups: list[devices.DeviceGroup], unhealthy: bool) -> list[devices.DeviceGroup]:
    group = groups[0]
    accs = list(group.accelerators)
    status = msgspec.structs.replace(accs[0].status, unhealthy=unhealthy)
    accs[0] = msgspec.structs.replace(accs[0], status=status)
    return [msgspec.structs.replace(group, accelerators=tuple(accs))]


class Reader:
    """A kubelet-like ListAndWatch stream, read by a thread; ``changed`` is notified per list.

    Lists are parsed only for ``on_update``: betterproto parses a device in tens of
    microseconds, holding the GIL, and kubelet (Go) does not make its Allocate calls wait
    for that.
    """

    def __init__(
        self,
        path: Path,
        on_update: Callable[[dp.ListAndWatchResponse], None] | None = None,
        changed: threading.Condition | None = None,
    ) -> None:
        self.updates = 0
        self.last = 0.0
        """perf_counter() when the latest list arrived."""
        self.changed = changed or threading.Condition()
        self._on_update = on_update
        self._channel = grpc.insecure_channel(f"unix:{path}")
        self._call = self._channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=bytes,
            response_deserializer=None if on_update is None else dp.ListAndWatchResponse.FromString,
        )(dp.Empty())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for update in self._call:
                when = time.perf_counter()
                if self._on_update is not None:
                    self._on_update(update)
                with self.changed:
                    self.updates, self.last = self.updates + 1, when
                    self.changed.notify_all()
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()
        self._thread.join(5)


def watch_all(
    directory: str, on_exclusive: Callable[[dp.ListAndWatchResponse], None] | None = None
) -> list[Reader]:
    """One reader per server, as kubelet keeps them; returns once each has its first list."""
    changed = threading.Condition()
    readers = [
        Reader(
            Path(directory) / f"nvidia.{mode}.sock",
            on_exclusive if mode == "exclusive" else None,
            changed,
        )
        for mode in SERVERS
    ]
    with changed:
        changed.wait_for(lambda: all(r.updates for r in readers), timeout=10)
    return readers


def allocate_calls(path: Path, ids: list[str]) -> list[float]:
    """One Allocate per id; (de)serialized outside the clock, as kubelet's Go code takes
    microseconds for what betterproto takes most of a millisecond."""
    requests = [
        bytes(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest([device])]))
        for device in ids
    ]
    timings, replies = [], []
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
        for request in requests:
            start = time.perf_counter()
            replies.append(call(request, timeout=5))
            timings.append(time.perf_counter() - start)
    for reply in replies:
        (container,) = dp.AllocateResponse.FromString(reply).container_responses
        assert "CUDA_DEVICE_MEMORY_LIMIT_0" in container.envs
    return timings


def kubelet(directory: str, ids: list[str]) -> tuple[list[float], int]:
    """Kubelet's side of phase 1: watch every server, then Allocate; (timings, lists re-sent)."""
    readers = watch_all(directory)
    try:
        sliced = Path(directory) / "nvidia.sliced.sock"
        allocate_calls(sliced, ids[:1])  # warm up the channel code
        timings = allocate_calls(sliced, ids[1:])
        return timings, sum(r.updates - 1 for r in readers)
    finally:
        for reader in readers:
            reader.close()


def wait_past(readers: list[Reader], counts: list[int]) -> None:
    """Block until each reader got more lists than it had in ``counts``."""
    with readers[0].changed:
        readers[0].changed.wait_for(
            lambda: all(r.updates > n for r, n in zip(readers, counts, strict=True)), timeout=10
        )


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


async def main(calls: int, flips: int, client: str, *, freeze: bool = False) -> None:
    groups = groups_h200()
    card = groups[0].accelerators
    ids = [f"nvidia-h200:{a.id}:{i:04d}" for a in card for i in range(128)][:calls]
    context = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory() as directory,
        concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool,
    ):
        pool.submit(int).result()  # start the client process before the clock runs
        settings = DevicePluginSettings.for_tests(directory)
        published: list[object] = []
        async with device_plugins(settings, publish=published.append) as plugins:
            plugins.update(groups)
            for mode in SERVERS:
                await anyio.to_thread.run_sync(wait_for, Path(directory) / f"nvidia.{mode}.sock")
            # health first: once cards are held in sliced mode their exclusive tokens are
            # Unhealthy whatever the card's own health
            await health(directory, plugins, groups, flips)

            def drive() -> tuple[list[float], int]:
                if client == "thread":
                    return kubelet(directory, ids)
                return pool.submit(kubelet, directory, ids).result()

            if freeze:
                gc.collect()
                gc.freeze()
            load = os.getloadavg()[0]
            cpu = time.thread_time()
            timings, resent = await anyio.to_thread.run_sync(drive)
            cpu = time.thread_time() - cpu
    print(
        f"Allocate (sliced, {len(timings)} calls, client in a {client}, load {load:.2f}"
        f"{', gc frozen' if freeze else ''}): "
        f"p50 {pct(timings, 0.5):.2f} ms, p99 {pct(timings, 0.99):.2f} ms, "
        f"max {max(timings) * 1000:.2f} ms; server loop CPU {cpu / len(timings) * 1000:.2f} "
        f"ms/call; {len(published)} events published, {resent} lists re-sent"
    )


async def health(
    directory: str, plugins: Plugins, groups: list[devices.DeviceGroup], flips: int
) -> None:
    """Flip card 0's health; time until its exclusive token shows it, and until every list
    that holds one of its tokens (all but partitioned, which has none here) was re-sent."""
    token = f"nvidia-h200:{groups[0].accelerators[0].id}:0000"
    states: list[str] = []

    def note(update: dp.ListAndWatchResponse) -> None:
        states.append({d.id: d.health for d in update.devices}[token])

    readers = await anyio.to_thread.run_sync(watch_all, directory, note)
    changing = [r for mode, r in zip(SERVERS, readers, strict=True) if mode != "partitioned"]
    first, every = [], []
    for flip in range(flips):
        before = [r.updates for r in changing]
        unhealthy = flip % 2 == 0
        start = time.perf_counter()
        plugins.update(with_health(groups, unhealthy))
        await anyio.to_thread.run_sync(wait_past, changing, before)
        assert states[-1] == ("Unhealthy" if unhealthy else "Healthy")
        first.append(readers[0].last - start)
        every.append(max(r.last for r in changing) - start)
    for reader in readers:
        reader.close()
    print(
        f"health change -> ListAndWatch ({flips} flips): exclusive list p50 "
        f"{pct(first, 0.5):.2f} ms, max {max(first) * 1000:.2f} ms; all 4 changed lists "
        f"(5,208 devices) p50 {pct(every, 0.5):.2f} ms, max {max(every) * 1000:.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50 if SMOKE else 1000)
    parser.add_argument("--flips", type=int, default=2 if SMOKE else 20)
    parser.add_argument("--client", choices=("process", "thread"), default="process")
    parser.add_argument("--gc-freeze", action="store_true")
    args = parser.parse_args()
    anyio.run(
        functools.partial(main, freeze=args.gc_freeze),
        min(args.calls, 1024),
        args.flips,
        args.client,
    )

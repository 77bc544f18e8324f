"""Device-plugin benchmarks: Allocate latency over the unix socket, health-to-ListAndWatch time.

Run: ``.venv/bin/python bench/bench_deviceplugin.py [--calls N]``. Simulates 8×H200, serves the
device plugins in a temporary directory (no kubelet needed: sockets are bound on the first
update) and drives them with grpcio, the C-core client closest to kubelet's grpc-go.

1. Allocate: N sliced allocations of distinct tokens (each charges the ledger, publishes an
   event and recomputes every server's token list), one grpcio call at a time on one channel;
   p50/p99 per call. Target p99 < 5 ms.
2. Health: flip one card unhealthy/healthy through ``Plugins.update``; time until the grpcio
   ListAndWatch reader holds the list with the new health. p50/max over the flips.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio
import anyio.to_thread
import grpc
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.deviceplugin.running import Plugins, device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from agent.devices import detection, sources
from agent.settings import DetectSettings
from bus import devices
from proto.deviceplugin import v1beta1 as dp


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


def allocate_calls(path: Path, ids: list[str]) -> list[float]:
    timings = []
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary(
            "/v1beta1.DevicePlugin/Allocate",
            request_serializer=bytes,
            response_deserializer=dp.AllocateResponse.FromString,
        )
        for device in ids:
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=[device])]
            )
            start = time.perf_counter()
            call(request, timeout=5)
            timings.append(time.perf_counter() - start)
    return timings


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.01)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


async def main(calls: int, flips: int) -> None:
    groups = groups_h200()
    card = groups[0].accelerators
    ids = [f"nvidia-h200:{a.id}:{i:04d}" for a in card for i in range(128)][:calls]
    with tempfile.TemporaryDirectory() as directory:
        settings = DevicePluginSettings.for_tests(directory)
        published: list[object] = []
        async with device_plugins(settings, publish=published.append) as plugins:
            plugins.update(groups)
            sliced = Path(directory) / "nvidia.sliced.sock"
            await anyio.to_thread.run_sync(wait_for, sliced)
            # health first: once cards are held in sliced mode their exclusive tokens are
            # Unhealthy whatever the card's own health
            await health(Path(directory) / "nvidia.exclusive.sock", plugins, groups, flips)
            await anyio.to_thread.run_sync(allocate_calls, sliced, ids[:1])  # warm up
            timings = await anyio.to_thread.run_sync(allocate_calls, sliced, ids[1:])
            print(
                f"Allocate (sliced, {len(timings)} calls): p50 {pct(timings, 0.5):.2f} ms, "
                f"p99 {pct(timings, 0.99):.2f} ms, max {max(timings) * 1000:.2f} ms; "
                f"{len(published)} events published"
            )


async def health(
    path: Path, plugins: Plugins, groups: list[devices.DeviceGroup], flips: int
) -> None:
    token = f"nvidia-h200:{groups[0].accelerators[0].id}:0000"
    seen: list[tuple[float, str]] = []
    arrived = threading.Event()
    channel = grpc.insecure_channel(f"unix:{path}")
    stream = channel.unary_stream(
        "/v1beta1.DevicePlugin/ListAndWatch",
        request_serializer=bytes,
        response_deserializer=dp.ListAndWatchResponse.FromString,
    )(dp.Empty())

    def read() -> None:
        try:
            for update in stream:
                health = {d.id: d.health for d in update.devices}[token]
                seen.append((time.perf_counter(), health))
                arrived.set()
        except grpc.RpcError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    await anyio.to_thread.run_sync(arrived.wait, 5)
    delays = []
    for flip in range(flips):
        arrived.clear()
        unhealthy = flip % 2 == 0
        start = time.perf_counter()
        plugins.update(with_health(groups, unhealthy))
        await anyio.to_thread.run_sync(arrived.wait, 5)
        when, state = seen[-1]
        assert state == ("Unhealthy" if unhealthy else "Healthy")
        delays.append(when - start)
    stream.cancel()
    channel.close()
    reader.join(5)
    print(
        f"health change -> ListAndWatch update ({flips} flips): "
        f"p50 {pct(delays, 0.5):.2f} ms, max {max(delays) * 1000:.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--flips", type=int, default=20)
    args = parser.parse_args()
    anyio.run(main, min(args.calls, 1024), args.flips)

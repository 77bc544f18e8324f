"""Webhook soak: does ``standalone``'s memory come back after bursts of concurrent requests?

Run: ``python bench/bench_soak.py [--rounds N] [--concurrency C]`` (default 10 × 2,000:
20,000 requests). Starts ``gpustack-operator standalone`` (simulated ``nvidia-h200x8``, every
port free, its own state directory), then sends rounds of ``C`` concurrent AdmissionReviews to
the worker's mutating webhook, each on its own TLS connection as API servers open them under
load, and reads the process's RSS from ``/proc`` before the first round and after each (once
the round's connections are closed). The figure (docs/benchmarks.md) is the end RSS against
the start, read once the process runner's heap trim (kit/heap.py) has run after the last round:
the target is within 25 %. ``BENCH_SMOKE=1``: 2 rounds of 20, to prove it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.admission.webhooks import MUTATE_PATH
from kit import heap

CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")
SMOKE = bool(os.environ.get("BENCH_SMOKE"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _review() -> bytes:
    container = {
        "name": "main",
        "image": "vllm/vllm-openai",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"containers": [container]},
    }
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": pod,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


async def _round(url: str, concurrency: int, context: ssl.SSLContext) -> int:
    """``concurrency`` requests at once, each on a new connection; how many got a 200."""
    body = _review()
    ok = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=True, ssl=context)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> None:
            nonlocal ok
            async with session.post(url, data=body) as response:
                await response.read()
                ok += response.status == 200

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(one)
    return ok


async def _ready(url: str, context: ssl.SSLContext) -> None:
    deadline = time.monotonic() + 90
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url, ssl=context) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("standalone did not become ready")
            await anyio.sleep(0.5)


async def soak(rounds: int, concurrency: int, env: dict[str, str]) -> None:
    port = _free_port()
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as state:
        argv = [
            CLI, "standalone", "--simulate=nvidia-h200x8", f"--state-dir={state}",
            "--nats-port=0", f"--worker-port={port}", "--device-manager-port=0",
            "--model-manager-port=0", "--dashboard-port=0", "--bind-address=127.0.0.1",
            "--node-name=soak.example",
        ]  # fmt: skip
        with (Path(state) / "stderr").open("wb") as log:
            process = await anyio.open_process(argv, stderr=log, stdout=subprocess.DEVNULL, env=env)
        try:
            base = f"https://127.0.0.1:{port}"
            await _ready(base + "/readyz", context)
            await _round(base + MUTATE_PATH, 10, context)  # warm: imports and first caches
            await anyio.sleep(2)
            start = _rss_mib(process.pid)
            print(f"start RSS {start:.0f} MiB ({rounds} rounds of {concurrency} concurrent)")
            for n in range(1, rounds + 1):
                began = time.monotonic()
                ok = await _round(base + MUTATE_PATH, concurrency, context)
                took = time.monotonic() - began
                await anyio.sleep(1)
                rss = _rss_mib(process.pid)
                print(f"round {n}: {ok}/{concurrency} answered in {took:.1f} s, RSS {rss:.0f} MiB")
                if ok != concurrency:
                    raise RuntimeError(f"round {n}: only {ok} of {concurrency} answered")
            await anyio.sleep(heap.TRIM_S + 2)  # settled: the runner's trim has run since
            end = _rss_mib(process.pid)
            growth = (end - start) / start * 100
            verdict = "within" if growth <= 25 else "OVER"
            print(
                f"end RSS {end:.0f} MiB: {growth:+.0f} % of the start ({verdict} the 25 % target)"
            )
        finally:
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(60):
                await process.wait()
            await process.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2 if SMOKE else 10)
    parser.add_argument("--concurrency", type=int, default=20 if SMOKE else 2000)
    args = parser.parse_args()
    anyio.run(soak, args.rounds, args.concurrency, dict(os.environ), backend_options={})


if __name__ == "__main__":
    main()

"""Model materialization benchmark: our downloader vs huggingface_hub vs curl, same server.

Run: ``.venv/bin/python bench/bench_models.py [--size-mib 256] [--files 4]`` (needs
``pip install huggingface_hub`` for the second contender; it is skipped otherwise).

A synthetic repository (``--files`` LFS files sharing ``--size-mib``, plus two small regular
files) is served by :mod:`hub.testing` (hub + CDN redirect, ``sendfile``, ranges) in its own
process. Each contender runs in a fresh child process so its peak RSS (``ru_maxrss``) is its own:

- **ours**: :class:`agent.models.materializing.Materializer` from empty cache to a published,
  read-only tree: listing, SHA-256 / git-SHA-1 of every byte, fsync, atomic publish;
- **huggingface_hub**: ``snapshot_download(local_dir=...)`` (it does not hash the bytes);
- **curl**: ``curl -Z -L`` of every file URL to /dev/null-like files (raw transfer, no hashing).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1024 * 1024
# ``BENCH_SMOKE=1`` (``just bench-smoke``, run by CI): tiny sizes, seconds in all, to prove the
# bench still runs; its figures mean nothing.
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")


def _chunks(size: int, seed: int):  # type: ignore[no-untyped-def]
    block = bytes((seed * 7 + i) % 251 for i in range(MiB))
    left = size
    while left > 0:
        n = min(MiB, left)
        yield block[:n]
        left -= n


def serve(root: str, size_mib: int, files: int) -> None:
    """Child: serve the synthetic repo; print endpoint and commit; run until stdin closes."""
    import anyio

    from hub import testing

    async def main() -> None:
        hub = testing.FakeHub(Path(root))
        per = size_mib * MiB // files
        specs = [(f"model-{i:05d}.safetensors", per, _chunks(per, i)) for i in range(files)]
        specs += [("config.json", 100, [b"x" * 100]), ("README.md", 10, [b"y" * 10])]
        commit = hub.add_streams("bench/model", specs)
        async with testing.serving(hub) as ep:
            print(json.dumps({"hub": ep.hub, "commit": commit}), flush=True)
            await anyio.to_thread.run_sync(sys.stdin.read)

    anyio.run(main)


def ours(endpoint: str, commit: str, dest: str) -> None:
    import anyio

    from agent.models import downloading, layout, materializing
    from agent.models.errors import Materializing
    from agent.models.metrics import ModelMetrics
    from agent.models.settings import Tuning
    from hub import client as hub_client
    from hub import resolving

    async def main() -> None:
        async with hub_client.client(hub_client.HubSettings(endpoint=endpoint)) as hub:
            manifest = await resolving.listing(hub, "bench/model", commit, token=None)
            cache = layout.Cache.open(Path(dest))

            async def reserve(_: str, __: int) -> None:
                return None

            hex_ = manifest.digest.removeprefix("sha256:")
            done = anyio.Event()
            m = materializing.Materializer(
                cache,
                hub,
                downloading.Limits(8, 0),
                tuning=Tuning(),
                metrics=ModelMetrics(),
                changed=lambda: None if hex_ in m.jobs else done.set(),
            )
            async with anyio.create_task_group() as tg:
                await tg.start(m.run, reserve)
                try:
                    m.ensure(hex_, materializing.Source("bench/model", commit, None))
                except Materializing:
                    pass
                await done.wait()
                tg.cancel_scope.cancel()
            assert cache.is_published(hex_), cache.load_digest(hex_)

    anyio.run(main)


def hf(endpoint: str, commit: str, dest: str) -> None:
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    from huggingface_hub import snapshot_download

    snapshot_download(
        "bench/model", revision=commit, local_dir=dest, endpoint=endpoint, max_workers=8
    )


def curl(endpoint: str, commit: str, dest: str) -> None:
    names = [p.name for p in Path(dest).parent.glob("__never__")]  # keep mypy quiet
    del names
    files = json.loads(os.environ["BENCH_FILES"])
    args = ["curl", "-s", "-f", "-L", "-Z", "--parallel-max", "8"]
    for i, name in enumerate(files):
        args += ["-o", f"{dest}/{i}", f"{endpoint}/bench/model/resolve/{commit}/{name}"]
    Path(dest).mkdir(parents=True, exist_ok=True)
    subprocess.run(args, check=True)


def child(kind: str, endpoint: str, commit: str, dest: str) -> None:
    start = time.perf_counter()
    {"ours": ours, "hf": hf, "curl": curl}[kind](endpoint, commit, dest)
    elapsed = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if kind == "curl":
        usage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"seconds": elapsed, "rss_mib": usage / 1024}))


def run(kind: str, endpoint: str, commit: str, work: Path, env: dict[str, str]) -> dict[str, float]:
    dest = work / kind
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(["sync"], check=False)
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, endpoint, commit, str(dest)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    shutil.rmtree(dest, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4 if SMOKE else 256)
    parser.add_argument("--files", type=int, default=2 if SMOKE else 4)
    parser.add_argument("--runs", type=int, default=1 if SMOKE else 2)
    parser.add_argument("--child", nargs=4)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-models-", dir=os.environ.get("BENCH_DIR")))
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(work / "hub"),
            str(args.size_mib),
            str(args.files),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        info = json.loads(server.stdout.readline())
        names = [f"model-{i:05d}.safetensors" for i in range(args.files)] + [
            "config.json",
            "README.md",
        ]
        env = {**os.environ, "BENCH_FILES": json.dumps(names)}
        kinds = ["ours"]
        if shutil.which("curl"):
            kinds.insert(0, "curl")
        else:
            print("curl not installed: skipping it", file=sys.stderr)
        try:
            import huggingface_hub  # noqa: F401

            kinds.append("hf")
        except ImportError:
            print("huggingface_hub not installed: skipping it", file=sys.stderr)
        size = args.size_mib * MiB
        print(f"repository: {args.files} files, {args.size_mib} MiB; best of {args.runs} runs")
        for kind in kinds:
            results = [run(kind, info["hub"], info["commit"], work, env) for _ in range(args.runs)]
            best = min(results, key=lambda r: r["seconds"])
            rate = size / best["seconds"] / MiB
            rss = max(r["rss_mib"] for r in results)
            print(
                f"{kind:>6}: {best['seconds']:7.2f} s  {rate:8.1f} MiB/s  peak RSS {rss:6.1f} MiB"
            )
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()

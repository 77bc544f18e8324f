"""Model materialization benchmark: ``mm pull`` vs huggingface_hub vs curl, same server.

Run: ``.venv/bin/python bench/bench_models.py [--size-mib 256] [--files 4]``, or
``--files 200 --file-kib 100`` for many small files (needs ``pip install huggingface_hub`` for
the third contender; it is skipped otherwise).

A synthetic repository (``--files`` LFS files sharing ``--size-mib``, plus two small regular
files) is served by :mod:`hub.testing` (hub + CDN redirect, ``sendfile``, ranges) in its own
process. Each contender runs in a fresh child process so its peak RSS (``ru_maxrss``) is its own;
the load average is printed before and after, since the machine may be shared, and each
contender's CPU time (user + system, its own process and children), which a shared machine
disturbs less than wall time:

- **pull**: the ``gpustack-operator mm pull`` command itself (a fresh process: imports
  included) from empty cache to a published, read-only tree: listing, SHA-256 / git-SHA-1 of
  every byte, fsync, atomic publish;
- **ours**: the same materialization in-process (``agent.models.materializing``), without the
  command's start-up (``--in-process``; what earlier runs of this bench measured);
- **before**: the ``mm pull`` command of another source tree (``--before-src DIR``, e.g. an
  exported earlier commit), for before/after figures from one run;
- **huggingface_hub**: ``snapshot_download(local_dir=...)`` (it does not hash the bytes);
- **curl**: ``curl -Z -L`` of every file URL to /dev/null-like files (raw transfer, no hashing);
- **noop**: ``mm pull`` of the digest once it is published (``--noop``): the command's fixed
  cost (start-up, the two listing requests, the check that finds the tree), which no transfer
  can shorten. Its figures are the second of two pulls in one child; the first is not timed.
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

# BENCH_SRC: import the code under test from another tree (the "before" contender).
sys.path.insert(0, os.environ.get("BENCH_SRC") or str(Path(__file__).resolve().parents[1]))

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


def serve(root: str, size_kib: int, files: int) -> None:
    """Child: serve the synthetic repo; print endpoint and commit; run until stdin closes."""
    import anyio

    from hub import testing

    async def main() -> None:
        hub = testing.FakeHub(Path(root))
        per = size_kib * 1024 // files
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

    try:
        from agent.models.tuning import Tuning
    except ImportError:  # a "before" tree older than the module
        from agent.models.settings import Tuning  # type: ignore[no-redef]
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


def pull(endpoint: str, commit: str, dest: str) -> None:
    # The console script's own lines, with the source tree (this one or BENCH_SRC) first (an
    # older tree has no ``console``: its script called ``main``).
    src = os.environ.get("BENCH_SRC") or str(Path(__file__).resolve().parents[1])
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'gpustack-operator'; "
        "import gpustack_operator.main as m; "
        "m.console() if hasattr(m, 'console') else sys.exit(m.main())"
    )
    env = {**os.environ, "HF_ENDPOINT": endpoint}
    argv = [sys.executable, "-c", code, src, "mm", "pull", "bench/model"]
    argv += ["--revision", commit, "--cache-root", dest]
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)


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
    who = resource.RUSAGE_CHILDREN if kind in ("curl", "pull", "noop") else resource.RUSAGE_SELF
    if kind == "noop":
        pull(endpoint, commit, dest)  # untimed: publishes the digest the timed run finds
    before = resource.getrusage(who)
    start = time.perf_counter()
    # noop: the same pull as the untimed one above, which left the digest published
    {"ours": ours, "pull": pull, "noop": pull, "hf": hf, "curl": curl}[kind](endpoint, commit, dest)
    elapsed = time.perf_counter() - start
    usage = resource.getrusage(who)
    # user + system: what the shared machine gave it
    cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
    print(json.dumps({"seconds": elapsed, "rss_mib": usage.ru_maxrss / 1024, "cpu_s": cpu}))


def run(kind: str, endpoint: str, commit: str, work: Path, env: dict[str, str]) -> dict[str, float]:
    dest = work / kind
    if kind == "before":
        kind, env = "pull", {**env, "BENCH_SRC": env["BENCH_BEFORE"]}
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


def compiled(root: str) -> None:
    """Byte-compile a source tree, as an installed package is: with ``PYTHONDONTWRITEBYTECODE``
    set (as on the machine that measured), every fresh process would compile it again."""
    import compileall
    import re

    compileall.compile_dir(root, quiet=1, rx=re.compile(r"/\.(venv|git)|/tests/"))


def contenders(args: argparse.Namespace, env: dict[str, str]) -> list[str]:
    """The kinds to run, in order; byte-compiles the trees whose command is timed."""
    kinds = ["pull", "ours"] if args.in_process else ["pull"]
    if args.noop:
        kinds.append("noop")
    compiled(str(Path(__file__).resolve().parents[1]))
    if args.before_src:
        compiled(args.before_src)
        kinds.append("before")
        env["BENCH_BEFORE"] = args.before_src
    if shutil.which("curl"):
        kinds.insert(0, "curl")
    else:
        print("curl not installed: skipping it", file=sys.stderr)
    try:
        import huggingface_hub  # noqa: F401

        kinds.append("hf")
    except ImportError:
        print("huggingface_hub not installed: skipping it", file=sys.stderr)
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4 if SMOKE else 256)
    parser.add_argument("--files", type=int, default=2 if SMOKE else 4)
    parser.add_argument("--file-kib", type=int, help="each file's size (overrides --size-mib)")
    parser.add_argument("--runs", type=int, default=1 if SMOKE else 3)
    parser.add_argument("--in-process", action="store_true", help="also time the in-process path")
    parser.add_argument("--before-src", help="a source tree whose `mm pull` is 'before'")
    parser.add_argument(
        "--noop", action="store_true", help="also time `mm pull` of a digest already published"
    )
    parser.add_argument("--child", nargs=4)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    size_kib = args.files * args.file_kib if args.file_kib else args.size_mib * 1024
    work = Path(tempfile.mkdtemp(prefix="bench-models-", dir=os.environ.get("BENCH_DIR")))
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(work / "hub"),
            str(size_kib),
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
        kinds = contenders(args, env)
        size = size_kib * 1024
        print(
            f"repository: {args.files} files + 2 small, {size_kib / 1024:.1f} MiB; median and "
            f"best of {args.runs} runs, contenders interleaved; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for _ in range(args.runs):
            for kind in kinds:
                results[kind].append(run(kind, info["hub"], info["commit"], work, env))
        for kind in kinds:
            times = sorted(r["seconds"] for r in results[kind])
            median = times[len(times) // 2]
            rss = max(r["rss_mib"] for r in results[kind])
            cpus = sorted(r["cpu_s"] for r in results[kind])
            print(
                f"{kind:>6}: median {median:7.2f} s ({size / median / MiB:7.1f} MiB/s), best "
                f"{times[0]:7.2f} s  CPU median {cpus[len(cpus) // 2]:5.2f} s  "
                f"peak RSS {rss:6.1f} MiB"
            )
        print(f"load average after: {os.getloadavg()[0]:.2f}")
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

"""Model materialization benchmark: ``mm pull`` vs huggingface_hub vs curl, same server.

Run: ``.venv/bin/python bench/bench_models.py [--shape 2000x10k --shape 200x100k ...]``; the
default shapes are 2,000 x 10 KiB, 200 x 100 KiB and 4 x 64 MiB (``huggingface_hub``, the
``bench`` extra, is the third contender where installed; it is skipped otherwise).

One synthetic repository per shape (the files, plus two small ones) is served from memory by
:mod:`fasthub` in its own process (keep-alive, ``TCP_NODELAY``, a resolve answered with a
redirect to a CDN path, as the Hub does for LFS files), so the server is never the bottleneck;
its CPU during each contender's run is reported beside the contender's. Each contender runs
in a fresh child process so its peak RSS (``ru_maxrss``) is its own; the load average is
printed before and after each shape, since the machine may be shared, and each contender's CPU
time (user + system, its own process and children), which a shared machine disturbs less than
wall time; contenders are interleaved run by run and medians reported:

- **pull**: the ``gpustack-operator mm pull`` command itself (a fresh process: imports
  included) from empty cache to a published, read-only tree: listing, SHA-256 / git-SHA-1 of
  every byte, fsync, atomic publish;
- **ours**: the same materialization in-process (``agent.models.materializing``), without the
  command's start-up (``--in-process``; what earlier runs of this bench measured);
- **before**: the ``mm pull`` command of another source tree (``--before-src DIR``, e.g. an
  exported earlier commit), for before/after figures from one run;
- **huggingface_hub**: ``snapshot_download(local_dir=...)`` (it does not hash the bytes);
- **curl**: ``curl --parallel --parallel-max 8 -L`` of every file URL (raw transfer, no hashing,
  no fsync);
- **noop**: ``mm pull`` of the digest once it is published (``--noop``): the command's fixed
  cost (start-up, the two listing requests, the check that finds the tree), which no transfer
  can shorten. An untimed pull publishes the digest first (outside the server's CPU reading).
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
import urllib.request
from pathlib import Path

# BENCH_SRC: import the code under test from another tree (the "before" contender).
sys.path.insert(0, os.environ.get("BENCH_SRC") or str(Path(__file__).resolve().parents[1]))

MiB = 1024 * 1024
# ``BENCH_SMOKE=1`` (``just bench-smoke``, run by CI): tiny sizes, seconds in all, to prove the
# bench still runs; its figures mean nothing.
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")


def serve(specs: list[str]) -> None:
    """Child: serve one repository per ``NAME:COUNTxSIZE`` spec from memory
    (:mod:`bench.fasthub`); print the endpoint and each repository's commit and files as one
    JSON line; serve until stdin closes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fasthub

    repos = []
    for i, spec in enumerate(specs):
        name, _, shape = spec.rpartition(":")
        count, _, size = shape.partition("x")
        repos.append(fasthub.make_repo(name, int(count), int(size), seed=i))

    def ready(port: int) -> None:
        info = {r.name: {"commit": r.commit, "files": sorted(r.files)} for r in repos}
        first = repos[0]
        line = {"hub": f"http://127.0.0.1:{port}", "repos": info, "commit": first.commit}
        print(json.dumps(line), flush=True)

    fasthub.run(fasthub.FastHub(repos), ready, sys.stdin.read)


def ours(endpoint: str, repo: str, commit: str, dest: str) -> None:
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
            manifest = await resolving.listing(hub, repo, commit, token=None)
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
                    m.ensure(hex_, materializing.Source(repo, commit, None))
                except Materializing:
                    pass
                await done.wait()
                tg.cancel_scope.cancel()
            assert cache.is_published(hex_), cache.load_digest(hex_)

    anyio.run(main)


def pull(endpoint: str, repo: str, commit: str, dest: str) -> None:
    # The console script's own lines, with the source tree (this one or BENCH_SRC) first (an
    # older tree has no ``console``: its script called ``main``).
    src = os.environ.get("BENCH_SRC") or str(Path(__file__).resolve().parents[1])
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'gpustack-operator'; "
        "import gpustack_operator.main as m; "
        "m.console() if hasattr(m, 'console') else sys.exit(m.main())"
    )
    env = {**os.environ, "HF_ENDPOINT": endpoint}
    argv = [sys.executable, "-c", code, src, "mm", "pull", repo]
    argv += ["--revision", commit, "--cache-root", dest]
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)


def hf(endpoint: str, repo: str, commit: str, dest: str) -> None:
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    from huggingface_hub import snapshot_download

    snapshot_download(repo, revision=commit, local_dir=dest, endpoint=endpoint, max_workers=8)


def curl(endpoint: str, repo: str, commit: str, dest: str) -> None:
    """``curl --parallel --parallel-max 8 -L`` of every file (8 transfers at once, as ``mm
    pull``'s 8 requests in flight), URLs from a config file (2,000 would strain argv)."""
    files = json.loads(os.environ["BENCH_FILES"])
    Path(dest).mkdir(parents=True, exist_ok=True)
    config = Path(dest) / ".curlrc"
    lines = [
        f'url = "{endpoint}/{repo}/resolve/{commit}/{name}"\noutput = "{dest}/{i}"'
        for i, name in enumerate(files)
    ]
    config.write_text("\n".join(lines) + "\n")
    args = ["curl", "-s", "-f", "-L", "--parallel", "--parallel-max", "8", "-K", str(config)]
    subprocess.run(args, check=True)


def child(kind: str, endpoint: str, repo: str, commit: str, dest: str) -> None:
    who = resource.RUSAGE_CHILDREN if kind in ("curl", "pull", "noop") else resource.RUSAGE_SELF
    before = resource.getrusage(who)
    start = time.perf_counter()
    # noop: the same pull as the untimed one above, which left the digest published
    kinds = {"ours": ours, "pull": pull, "noop": pull, "hf": hf, "curl": curl}
    kinds[kind](endpoint, repo, commit, dest)
    elapsed = time.perf_counter() - start
    usage = resource.getrusage(who)
    # user + system: what the shared machine gave it
    cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
    print(json.dumps({"seconds": elapsed, "rss_mib": usage.ru_maxrss / 1024, "cpu_s": cpu}))


def server_cpu(endpoint: str) -> float:
    """The stand-in's CPU seconds so far (its ``/_bench/cpu``)."""
    with urllib.request.urlopen(f"{endpoint}/_bench/cpu", timeout=30) as answer:
        return float(answer.read())


def run(kind: str, endpoint: str, repo: str, work: Path, env: dict[str, str]) -> dict[str, float]:
    """One contender's run in a fresh child: its wall, CPU and peak RSS, and the server's CPU
    during it."""
    dest = work / kind
    if kind.startswith("before"):
        kind, env = "pull", {**env, "BENCH_SRC": env[f"BENCH_SRC_{kind}"]}
    shutil.rmtree(dest, ignore_errors=True)
    if kind == "noop":  # untimed, before the server's CPU is read: publishes what noop finds
        pull(endpoint, repo, env["BENCH_COMMIT"], str(dest))
    subprocess.run(["sync"], check=False)
    served = server_cpu(endpoint)
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, endpoint, repo, env["BENCH_COMMIT"], str(dest)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    served = server_cpu(endpoint) - served
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    result["server_cpu_s"] = served
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
    for i, src in enumerate(args.before_src or ()):
        compiled(src)
        kind = "before" if len(args.before_src) == 1 else f"before{i + 1}"
        kinds.append(kind)
        env[f"BENCH_SRC_{kind}"] = src
    if shutil.which("curl"):
        kinds.insert(0, "curl")
    else:
        print("curl not installed: skipping it", file=sys.stderr)
    try:
        import huggingface_hub  # noqa: F401

        if not args.no_hf:
            kinds.append("hf")
    except ImportError:
        print("huggingface_hub not installed (the `bench` extra): skipping it", file=sys.stderr)
    return kinds


SIZES = {"k": 1024, "m": MiB}
SHAPES = ["20x10k", "4x100k", "2x1m"] if SMOKE else ["2000x10k", "200x100k", "4x64m"]


def shape_bytes(shape: str) -> tuple[int, int]:
    """``2000x10k`` -> (2000, 10240): a count of files and each one's size."""
    count, _, size = shape.lower().partition("x")
    unit = SIZES.get(size[-1:], 1)
    return int(count), int(size.rstrip("km")) * unit


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def report(shape: str, kinds: list[str], results: dict[str, list[dict[str, float]]]) -> None:
    """One line per contender: medians, best, CPU (its own and the server's), peak RSS, and
    its ratio to curl's median (wall and CPU) where curl ran."""
    base = results.get("curl")
    for kind in kinds:
        rs = results[kind]
        wall = median([r["seconds"] for r in rs])
        cpu = median([r["cpu_s"] for r in rs])
        ratio = ""
        if base and kind != "curl":
            ratio = (
                f"  {wall / median([r['seconds'] for r in base]):5.2f}x curl wall, "
                f"{cpu / median([r['cpu_s'] for r in base]):5.2f}x CPU"
            )
        print(
            f"  {kind:>7}: median {wall:6.3f} s best {min(r['seconds'] for r in rs):6.3f} s  "
            f"CPU {cpu:6.3f} s  server CPU {median([r['server_cpu_s'] for r in rs]):6.3f} s  "
            f"peak RSS {max(r['rss_mib'] for r in rs):6.1f} MiB{ratio}"
        )


def bench_shape(args: argparse.Namespace, shape: str, info: dict, work: Path) -> None:  # type: ignore[type-arg]
    repo = f"bench/{shape}"
    count, size = shape_bytes(shape)
    env = {**os.environ, "BENCH_FILES": json.dumps(info["repos"][repo]["files"])}
    env["BENCH_COMMIT"] = info["repos"][repo]["commit"]
    kinds = contenders(args, env)
    print(
        f"{count} x {size / 1024:g} KiB (+2 small files); median and best of {args.runs} runs, "
        f"contenders interleaved; load average {os.getloadavg()[0]:.2f}"
    )
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for _ in range(args.runs):
        for kind in kinds:
            results[kind].append(run(kind, info["hub"], repo, work, env))
    report(shape, kinds, results)
    print(f"  load average after: {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--shape",
        action="append",
        help=f"COUNTxSIZE (k, m suffixes), repeatable; default {' '.join(SHAPES)}",
    )
    parser.add_argument("--runs", type=int, default=1 if SMOKE else 5)
    parser.add_argument("--in-process", action="store_true", help="also time the in-process path")
    parser.add_argument(
        "--before-src",
        action="append",
        help="a source tree whose `mm pull` is 'before' (repeatable: before1, before2, ...)",
    )
    parser.add_argument(
        "--noop", action="store_true", help="also time `mm pull` of a digest already published"
    )
    parser.add_argument("--no-hf", action="store_true", help="skip huggingface_hub")
    parser.add_argument("--child", nargs=5)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    shapes = args.shape or SHAPES
    for shape in shapes:
        shape_bytes(shape)  # a malformed shape fails here, before the server starts
    work = Path(tempfile.mkdtemp(prefix="bench-models-", dir=os.environ.get("BENCH_DIR")))
    specs = [f"bench/{s}:{'x'.join(map(str, shape_bytes(s)))}" for s in shapes]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", *specs],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        info = json.loads(server.stdout.readline())
        print(f"server: bench/fasthub.py (pid {server.pid}), in memory, keep-alive, TCP_NODELAY")
        for shape in shapes:
            bench_shape(args, shape, info, work)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2:])
    else:
        main()

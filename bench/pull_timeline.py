"""Where the time of one ``mm pull`` goes: wall and CPU at each step, from ``exec`` to exit.

Run: ``.venv/bin/python bench/pull_timeline.py [--files 200 --file-kib 100] [--runs 7]``.

A synthetic repository is served from memory as by ``bench_models.py`` (its ``--serve``
child, :mod:`fasthub`). Each run
starts a fresh process that runs the console script in-process with a few of the pull's
functions wrapped to note when they first start and last end (the resolve, the file requests,
the landings, the seal and the publication), so the figures include the interpreter's start,
every import and the exit. Times are from the moment the parent spawned the process; CPU is
the process's and the main thread's. The wrapping costs a few microseconds per file.

It measures this tree's code only, and wraps private functions by name: a rename here fails
the smoke run (``BENCH_SMOKE=1``, in ``just bench-smoke``) rather than measuring nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

# Only what the child needs is imported at the top, so the child's "interpreter" step is the
# interpreter's start and not this script's imports; the parent imports the rest in main().
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")
STEPS = (
    "interpreter",
    "main imported",
    "pull imported",
    "resolve>",
    "resolve<",
    "request>",
    "request<",
    "land<",
    "seal>",
    "publish>",
    "publish<",
    "exit",
)


def child(endpoint: str, commit: str, cache: str) -> None:
    """Run ``mm pull`` in this process, noting each step; print the notes as one JSON line at
    exit. Only ``os``, ``sys`` and ``time`` are imported before the first note."""
    t0 = float(os.environ["TIMELINE_T0"])
    notes: dict[str, tuple[float, float, float]] = {}

    import threading

    def note(step: str) -> None:
        own = time.thread_time() if threading.current_thread() is threading.main_thread() else -1
        notes[step] = (time.time() - t0, time.process_time(), own)

    note("interpreter")
    import atexit

    sys.path.insert(0, ROOT)
    sys.argv = ["gpustack-operator", "mm", "pull", "bench/model", "--revision", commit]
    sys.argv += ["--cache-root", cache]
    os.environ["HF_ENDPOINT"] = endpoint
    import gpustack_operator.main as entry

    note("main imported")
    from agent.models import diskio, downloading, publishing
    from agent.models import pull as _pull  # noqa: F401  (imported here to time it)
    from hub import resolving

    note("pull imported")
    _wrap(resolving, "resolve", note, "resolve")
    _wrap(downloading, "_whole_body", note, "request")
    _wrap(diskio, "land", note, "land")
    _wrap(publishing, "seal_files", note, "seal")
    _wrap(publishing, "publish", note, "publish")

    def report() -> None:
        note("exit")
        import json

        print(json.dumps(notes), flush=True)

    atexit.register(report)
    entry.console()


def _wrap(module: object, name: str, note: Callable[[str], None], step: str) -> None:
    """Replace ``module.name`` by a wrapper noting ``step>`` at its first call and ``step<``
    at the end of its latest."""
    import inspect

    real = getattr(module, name)
    seen: list[bool] = []

    def first() -> None:
        if not seen:
            seen.append(True)
            note(step + ">")

    if inspect.iscoroutinefunction(real):

        async def wrapped_async(*args: object, **kwargs: object) -> object:
            first()
            result = await real(*args, **kwargs)
            note(step + "<")
            return result

        setattr(module, name, wrapped_async)
        return

    def wrapped(*args: object, **kwargs: object) -> object:
        first()
        result = real(*args, **kwargs)
        note(step + "<")
        return result

    setattr(module, name, wrapped)


def run_once(endpoint: str, commit: str, cache: str) -> dict[str, list[float]]:
    import json
    import shutil
    import subprocess

    shutil.rmtree(cache, ignore_errors=True)
    # The child imports this module (byte-compiled by main) rather than running it as a script,
    # which Python would compile anew each time, inside the "interpreter" step.
    code = "import sys; sys.path.insert(0, sys.argv[1]); import pull_timeline as t; t.child(*sys.argv[2:])"
    argv = [sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__))]
    argv += [endpoint, commit, cache]
    env = {**os.environ, "TIMELINE_T0": repr(time.time())}
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env)
    notes: dict[str, list[float]] = json.loads(out.stdout.strip().splitlines()[-1])
    missing = [step for step in STEPS if step not in notes]
    if missing:
        raise SystemExit(f"steps never reached (a wrapped function renamed?): {missing}")
    return notes


def main() -> None:
    import argparse
    import json
    import shutil
    import subprocess
    import tempfile

    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=4 if SMOKE else 200)
    parser.add_argument("--file-kib", type=int, default=16 if SMOKE else 100)
    parser.add_argument("--runs", type=int, default=1 if SMOKE else 7)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_models import compiled

    compiled(ROOT)  # as an installed package is, whatever PYTHONDONTWRITEBYTECODE says
    work = tempfile.mkdtemp(prefix="pull-timeline-", dir=os.environ.get("BENCH_DIR"))
    serve = [sys.executable, os.path.join(ROOT, "bench", "bench_models.py"), "--serve"]
    serve.append(f"bench/model:{args.files}x{args.file_kib * 1024}")
    server = subprocess.Popen(serve, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        info = json.loads(server.stdout.readline())
        cache = os.path.join(work, "cache")
        runs = [run_once(info["hub"], info["commit"], cache) for _ in range(args.runs)]
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    report(runs, f"{args.files} files of {args.file_kib} KiB; median of {args.runs} runs (ms)")


def report(runs: list[dict[str, list[float]]], title: str) -> None:
    """Medians per step; a note taken in a worker thread has no main-thread CPU ("-")."""
    import statistics

    print(title)
    print(f"{'step':>14}  {'wall':>6}  {'process CPU':>11}  {'main thread CPU':>15}")
    for step in STEPS:
        wall, cpu, own = (statistics.median(1000 * run[step][k] for run in runs) for k in range(3))
        shown = f"{own:15.1f}" if own >= 0 else f"{'-':>15}"
        print(f"{step:>14}  {wall:6.1f}  {cpu:11.1f}  {shown}")


if __name__ == "__main__":
    main()

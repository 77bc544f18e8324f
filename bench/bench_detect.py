"""Cold start of ``dm detect``: wall time and peak RSS of a fresh process, against baselines.

Each case runs in a new interpreter ``RUNS`` times; wall time is from spawn to exit, peak RSS is
the child's own ``ru_maxrss`` from ``os.wait4`` (so runs do not mask each other). Reported: the
median and the worst run. Targets (issue #2): ``dm detect`` on a simulated 8-GPU profile
<= 150 ms and <= 40 MB on the development machine.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

# ``BENCH_SMOKE=1`` (``just bench-smoke``, run by CI): tiny sizes, seconds in all, to prove the
# bench still runs; its figures mean nothing.
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")
RUNS = 1 if SMOKE else int(os.environ.get("BENCH_RUNS", "15"))
# The interpreter's own entry point first: the bench runs from a virtual environment that need
# not be activated (then PATH does not name it). ``BENCH_DETECT_SOURCE=DIR`` runs the launcher of
# another checkout instead (``python -m gpustack_operator.main`` from DIR);
# ``BENCH_DETECT_BEFORE=DIR`` alternates this checkout with DIR on the NVIDIA-only cases.
_BESIDE = Path(sys.executable).parent / "gpustack-operator"
_SOURCE = os.environ.get("BENCH_DETECT_SOURCE", "")
CLI: list[str] = (
    [sys.executable, "-m", "gpustack_operator.main"]
    if _SOURCE
    else [
        str(_BESIDE)
        if _BESIDE.exists()
        else shutil.which("gpustack-operator") or "gpustack-operator"
    ]
)

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import service stacks": [
        sys.executable,
        "-c",
        "import kubernetes_asyncio.client, nats, grpclib.server, prometheus_client, aiohttp",
    ],
    "dm detect --simulate nvidia-h200x8": [*CLI, "dm", "detect", "--simulate", "nvidia-h200x8"],
    "dm detect -o json --simulate nvidia-h200x8": [
        *CLI,
        "dm",
        "detect",
        "-o",
        "json",
        "--simulate",
        "nvidia-h200x8",
    ],
    "dm monitor --simulate amd-rx7800xt-x2": [
        *CLI,
        "dm",
        "monitor",
        "--simulate",
        "amd-rx7800xt-x2",
    ],
    "dm detect (no accelerators, real host)": [*CLI, "dm", "detect", "--no-fast-failed"],
}
if not _SOURCE:
    # Library-read manufacturers (a simulated vendor library behind the PCI check); the
    # checkout compared against may not have them.
    CASES["dm detect --simulate ascend-910b2x8"] = [
        *CLI, "dm", "detect", "--simulate", "ascend-910b2x8",
    ]  # fmt: skip
    CASES["dm monitor --simulate hygon-k100-ai-x8"] = [
        *CLI, "dm", "monitor", "--simulate", "hygon-k100-ai-x8",
    ]  # fmt: skip


COMPARED = ("dm detect --simulate nvidia-h200x8", "dm detect (no accelerators, real host)")
"""The NVIDIA-only-host cases ``BENCH_DETECT_BEFORE=DIR`` compares with another checkout."""


def run_once(argv: list[str], cwd: str | None = None) -> tuple[float, float, float]:
    """Return (wall seconds, CPU seconds, peak RSS MiB) of one fresh process.

    CPU time (user + system of the child) is what a busy shared machine disturbs least.
    """
    start = time.perf_counter()
    process = subprocess.Popen(
        argv, cwd=cwd or _SOURCE or None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0,):
        raise SystemExit(f"{argv} exited {process.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def compare(before: str) -> None:
    """Alternate runs of this checkout and ``before`` (so machine load drifts hit both alike).

    The other checkout runs as ``python -m gpustack_operator.main`` from its directory.
    """
    print(f"{RUNS} alternating runs each (medians, then minimum CPU), before = {before}")
    print(
        f"{'case':<44} {'CPU before':>11} {'CPU after':>10} {'CPU min bef.':>11} "
        f"{'CPU min aft.':>11} {'wall before':>12} {'wall after':>11}"
    )
    for name in COMPARED:
        # Both as ``python -m`` from their own directory: the same start-up path either way.
        argv = [sys.executable, "-m", "gpustack_operator.main", *CASES[name][len(CLI) :]]
        here = str(Path(__file__).resolve().parent.parent)
        runs: dict[str, list[tuple[float, float, float]]] = {"before": [], "after": []}
        run_once(argv, here)
        run_once(argv, before)
        for _ in range(RUNS):
            runs["before"].append(run_once(argv, before))
            runs["after"].append(run_once(argv, here))
        cpu = {k: statistics.median(c for _, c, _ in v) * 1000 for k, v in runs.items()}
        low = {k: min(c for _, c, _ in v) * 1000 for k, v in runs.items()}
        wall = {k: statistics.median(w for w, _, _ in v) * 1000 for k, v in runs.items()}
        print(
            f"{name:<44} {cpu['before']:>8.1f} ms {cpu['after']:>7.1f} ms "
            f"{low['before']:>8.1f} ms {low['after']:>7.1f} ms "
            f"{wall['before']:>9.1f} ms {wall['after']:>8.1f} ms"
        )


def main() -> None:
    before = os.environ.get("BENCH_DETECT_BEFORE", "")
    if before:
        compare(before)
        return
    print(f"{RUNS} runs each, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(
        f"{'case':<44} {'wall median':>12} {'wall max':>10} {'CPU median':>11} "
        f"{'RSS median':>11} {'RSS max':>9}"
    )
    for name, argv in CASES.items():
        run_once(argv)  # warm the page cache
        results = [run_once(argv) for _ in range(RUNS)]
        walls = [w * 1000 for w, _, _ in results]
        cpus = [c * 1000 for _, c, _ in results]
        rss = [r for _, _, r in results]
        print(
            f"{name:<44} {statistics.median(walls):>9.1f} ms {max(walls):>7.1f} ms "
            f"{statistics.median(cpus):>8.1f} ms "
            f"{statistics.median(rss):>8.1f} MB {max(rss):>6.1f} MB"
        )


if __name__ == "__main__":
    main()

"""kit.heap: what is alive is frozen out of the automatic collections, a cycle that died frozen
is still collected at the full round, and nothing stays frozen once the pacing ends."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import anyio
import pytest

from kit.heap import pace_collections

pytestmark = pytest.mark.anyio


class _Cell:
    other: _Cell | None = None


async def _until(predicate: Callable[[], bool], *, tries: int = 2000) -> None:
    for _ in range(tries):
        if predicate():
            return
        await anyio.sleep(0.005)
    raise AssertionError("never happened")


async def test_a_cycle_that_died_frozen_is_collected_at_the_full_round() -> None:
    a, b = _Cell(), _Cell()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pace_collections, 0.01, 0.2)
        await _until(lambda: gc.get_freeze_count() > 0)
        del a, b  # frozen while alive: no automatic collection sees it any more
        gc.collect(1)
        await _until(lambda: gone() is None)
        tg.cancel_scope.cancel()
    assert gc.get_freeze_count() == 0


_FRAGMENT = """
import anyio, sys
from kit import heap

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

blocks = [bytearray(2048) for _ in range(40000)]  # ~80 MiB from malloc, page after page
kept = blocks[::64]  # one block in 64 stays: the heap's top cannot shrink by itself
del blocks
before = rss_kib()

async def main():
    with anyio.move_on_after(0.5):
        await heap.trim_heap(0.05)

anyio.run(main)
print(before, rss_kib(), len(kept))
"""


def test_trimming_hands_freed_native_memory_back() -> None:
    """Freed blocks between live ones stay in RSS until the trim: glibc's own trimming only
    gives back a free top of the heap (the standalone webhook soak, docs/benchmarks.md)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _FRAGMENT], capture_output=True, text=True, check=True, timeout=60
    )
    before, after, _ = (int(x) for x in result.stdout.split())
    assert before - after > 40 * 1024, (before, after)  # most of the 80 MiB came back

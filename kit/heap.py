"""Pacing the garbage collector of a process whose heap is large, long-lived and acyclic, and
handing freed native memory back to the system.

Trimming (:func:`trim_heap`): a burst of concurrent TLS connections (2,000 webhook requests at
once) makes OpenSSL and the event loop allocate per-connection buffers from glibc's heap; once
they are freed, glibc keeps the free space (it returns only a free *top* of the heap), so RSS
rose round after round: standalone 124 → 514 MiB over seven such rounds. tracemalloc showed no
Python object growing, and ``malloc_trim(0)`` brought a probe from 412 back to 110 MiB: freed
memory kept, not a leak (``MALLOC_ARENA_MAX=2`` did not help: one thread allocates it all).
So every service trims every :data:`TRIM_S` (:mod:`gpustack_operator.process`); a no-op where
the C library has no ``malloc_trim`` (musl).

Why: the worker holds every node's objects (the ledger, the objects it last read or wrote, the
chain's listed Nodes). CPython's full collection scans every tracked object, and for such a heap
it frees next to nothing: at 10,000 nodes it measured 0.1-1.1 s per full collection, 14 in one
bench run, each a stall of the event loop, and together they were the worker's p99 event
latency (docs/benchmarks.md).

How (:func:`pace_collections`): every ``freeze_s`` the objects then alive move to the permanent
generation (:func:`gc.freeze`), so the automatic collections scan only what was made since.
Every ``full_s`` the permanent generation is released and collected once (:func:`gc.unfreeze`,
then :func:`gc.collect`): one deliberate pause in that period instead of one every few seconds.

Invariants: reference counting frees frozen objects as always, so memory follows the live data;
only *cyclic* garbage that died while frozen waits, at most ``full_s``, for the full collection.
On exit (cancellation) nothing stays frozen.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable
from typing import Final

import anyio

__all__ = ["FREEZE_S", "FULL_S", "TRIM_S", "pace_collections", "trim_heap", "trim_now"]

TRIM_S: Final = 10.0
"""How often freed native memory is handed back: a burst's buffers are gone within this."""

FREEZE_S: Final = 10.0
"""How often what is alive is frozen out of the automatic collections."""
FULL_S: Final = 600.0
"""How often everything is collected once, cycles that died frozen included."""


async def pace_collections(freeze_s: float = FREEZE_S, full_s: float = FULL_S) -> None:
    """Freeze every ``freeze_s``, collect everything every ``full_s``; runs until cancelled."""
    rounds = max(1, round(full_s / freeze_s))
    try:
        while True:
            for _ in range(rounds):
                await anyio.sleep(freeze_s)
                gc.freeze()
            gc.unfreeze()
            gc.collect()
    finally:
        gc.unfreeze()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_now() -> bool:
    """Hand the heap's free pages back to the system now; False where that is not possible.
    Milliseconds for a heap of hundreds of MiB; it takes glibc's heap lock meanwhile."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


async def trim_heap(period_s: float = TRIM_S) -> None:
    """Trim every ``period_s`` (see the module docstring); runs until cancelled."""
    if _malloc_trim() is None:
        return
    while True:
        await anyio.sleep(period_s)
        trim_now()

"""Pacing the garbage collector of a process whose heap is large, long-lived and acyclic.

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

import gc
from typing import Final

import anyio

__all__ = ["FREEZE_S", "FULL_S", "pace_collections"]

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

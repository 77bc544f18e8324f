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

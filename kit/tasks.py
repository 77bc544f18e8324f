"""Long-lived tasks: named, and never allowed to end unnoticed.

A service's task group holds parts that run until cancelled (a watch, a resync loop, a
subscription). :func:`start_forever` starts one so that, should it ever return, the process says
which part stopped instead of carrying on half-working without a word; task names show up in
anyio's and asyncio's task listings, so a hung shutdown names its culprit.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from anyio.abc import TaskGroup

__all__ = ["start_forever"]

log = logging.getLogger(__name__)


def start_forever(
    tg: TaskGroup, name: str, func: Callable[..., Awaitable[Any]], *args: Any
) -> None:
    """Start ``func(*args)`` in ``tg`` as the task ``name``; log an error if it ever returns."""

    async def body() -> None:
        await func(*args)
        log.error("%s stopped on its own; it should run until the process stops", name)

    tg.start_soon(body, name=name)

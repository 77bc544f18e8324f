"""Test harness for the servers :mod:`kit.serving` starts: cancelling a start at every step.

Production modules never import this. Tests of every aiohttp server the project runs (the
shared HTTPS endpoint, the metrics port, the dashboard) use :func:`cancel_every_start` to prove
that a start cancelled at any loop turn leaves no socket open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio

__all__ = ["cancel_every_start", "socket_fds"]


def socket_fds() -> frozenset[str]:
    """Sockets this process holds open (``/proc/self/fd``), each named by its inode.

    A set, not a count: a socket another test left to the collector, closed meanwhile, must not
    hide one leaked here.
    """
    found = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue  # closed meanwhile (the directory's own descriptor)
        if target.startswith("socket:"):
            found.add(target)
    return frozenset(found)


async def cancel_every_start(
    open_server: Callable[[], AbstractAsyncContextManager[object]], turns: int = 40
) -> None:
    """Enter the server ``open_server`` makes, cancelled after 0, 1, 2... loop turns.

    :raises AssertionError: a socket was left open after some cancelled start (the start must
        either never bind one or close the server it started), or no turn reached a server.
    """
    before = socket_fds()
    served = 0
    for n in range(turns):
        with anyio.CancelScope() as scope:

            async def cancel_after(n: int = n, scope: anyio.CancelScope = scope) -> None:
                for _ in range(n):
                    await asyncio.sleep(0)
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_after)
                async with open_server():
                    served += 1
                    await anyio.sleep_forever()
        if leaked := socket_fds() - before:
            raise AssertionError(f"{sorted(leaked)} left open after {n} loop turns")
    if not served:
        raise AssertionError(f"no start completed within {turns} loop turns")

"""Fixtures every test shares: the event loops async tests run on, and the leaked-task check.

Every ``anyio`` test runs twice: on the plain asyncio loop and on uvloop, the loop the services
run on in production (``anyio.run(..., backend_options={"use_uvloop": True})``). The two differ
in timing, in thread hand-offs and in what they let through unchecked; a test that passes on one
loop only is a bug in the test or in the code.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

# How many loop iterations a test's tasks get, after its fixtures are torn down, to finish
# a cancellation already under way (a task cancelled in the last step of a teardown needs
# one to run its ``finally``). A task still pending after them was left running.
SETTLE_ITERATIONS = 20

LOOPS: list[Any] = [pytest.param("asyncio", id="asyncio")]
if sys.platform != "win32":
    LOOPS.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))


@pytest.fixture(scope="module", params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture(autouse=True)
def _no_leaked_tasks(request: pytest.FixtureRequest) -> None:
    """Fails an async test that leaves tasks running once it and its fixtures are done."""
    if "anyio_backend" in request.fixturenames:
        # Requested here, first, so that it is torn down last: after every fixture of the test.
        request.getfixturevalue("_leaked_tasks_check")


@pytest.fixture
async def _leaked_tasks_check() -> AsyncIterator[None]:
    __tracebackhide__ = True
    yield
    for _ in range(SETTLE_ITERATIONS):
        leaked = {t for t in asyncio.all_tasks() if not _runners(t)}
        if not leaked:
            return
        await asyncio.sleep(0)
    for task in leaked:
        task.cancel()
    described = "\n".join(f"  {t.get_name()}: {_where(t)}" for t in sorted(leaked, key=id))
    pytest.fail(f"{len(leaked)} task(s) still running after the test ended:\n{described}")


def _runners(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is one of anyio's test runner: the task that runs the test and its
    fixtures (this check included), or the one the runner's loop waits on for each step."""
    if task is asyncio.current_task():
        return True
    return getattr(task.get_coro(), "__qualname__", "") == "TestRunner._call_in_runner_task"


def _where(task: asyncio.Task[Any]) -> str:
    """The chain of coroutines a leaked task waits in, outermost first."""
    links: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None and len(links) < 12:
        code, frame = getattr(coro, "cr_code", None), getattr(coro, "cr_frame", None)
        if code is None:
            links.append(repr(coro))
            break
        line = f":{frame.f_lineno}" if frame is not None else ""
        links.append(f"{code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]}{line})")
        coro = getattr(coro, "cr_await", None)
    return " -> ".join(links)

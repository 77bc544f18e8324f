"""Fixtures every test shares: the event loop of async tests, the leaked-task check, short
scratch directories, and (on request) the default ports held for the whole run.

**Which loop.** An ``anyio`` test runs on uvloop, the loop every service (and ``mm pull``) runs
on in production (``gpustack_operator/process.py``, ``anyio.run(...,
backend_options={"use_uvloop": True})``). A test marked ``every_loop`` also runs on the plain
asyncio loop. Mark a test (or a module, in ``pytestmark``) when the code it tests does its own
I/O through the test's loop: it opens, serves or closes sockets, TLS or unix-socket transports,
reads a child process's pipes through the loop, or hands work between the loop and threads,
and so depends on how the loop's transports behave (when an error surfaces, what a close or a
cancellation leaves, how writes are buffered). uvloop (libuv) and asyncio (selectors) are two
implementations of those; the code must hold on both, since asyncio is the loop where uvloop is
not installed and the one ``mm manifest`` runs on. Do not mark:

- tests whose subject runs in a child process (``gpustack-operator ...`` run as a command): the
  child picks its own loop, and the test's loop only waits for it;
- tests of logic above those I/O layers (reconciling, admission, the gateway's and the
  extension API's handlers, the agents' decisions), which reach the network only through a
  layer whose own tests carry the mark: a second run re-tests that layer, not theirs;
- tests of pure code and anyio's own primitives (memory streams, events, sleeps, task groups),
  which both loops run through the same asyncio machinery.

Either way a test fails if it leaves a task running once it and its fixtures are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

# How many loop iterations a test's tasks get, after its fixtures are torn down, to finish
# a cancellation already under way (a task cancelled in the last step of a teardown needs
# one to run its ``finally``). A task still pending after them was left running.
SETTLE_ITERATIONS = 20

PRODUCTION_LOOP: Any = "asyncio" if sys.platform == "win32" else ("asyncio", {"use_uvloop": True})
"""The loop the services run on: uvloop wherever it is installed (a dependency, but on Windows)."""

LOOPS: list[Any] = [pytest.param("asyncio", id="asyncio")]
if sys.platform != "win32":
    LOOPS.append(pytest.param(PRODUCTION_LOOP, id="uvloop"))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers a core. Most tests wait (on nats-server, a child process, a
    timer, a real HTTP peer) more than they compute, so one worker a core left the cores idle:
    on 2 cores the suite took 5:02 with two workers and 2:55 with four."""
    del config
    return 2 * (os.cpu_count() or 1)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """An async test marked ``every_loop`` runs once per loop; any other once, on uvloop."""
    if "anyio_backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "every_loop"
    ):
        metafunc.parametrize("anyio_backend", LOOPS, scope="module")


@pytest.fixture(scope="module")
def anyio_backend() -> Any:
    return PRODUCTION_LOOP


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


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A fresh directory with a short path, removed afterwards: for a state directory that
    will hold unix sockets. A socket's path has at most 107 bytes on Linux, and ``tmp_path`` under
    xdist (``/tmp/pytest-of-<user>/pytest-<n>/popen-gw<k>/<test name>0``) takes 70 to 80 of them
    before a device plugin's ``device-plugins/nvidia.partitioned.sock`` is added."""
    directory = Path(tempfile.mkdtemp(prefix="gso-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def default_ports() -> set[int]:
    """Every port a command binds or dials when not told otherwise (its flags' defaults)."""
    from gpustack_operator.commands import COMMANDS, PORT

    return {
        int(flag.default)
        for command in COMMANDS
        for flag in command.flags
        if flag.bounds == PORT and flag.default not in ("", "0")
    }


@pytest.fixture(scope="session", autouse=True)
def _default_ports_held() -> Iterator[None]:
    """With ``GPUSTACK_HOLD_DEFAULT_PORTS=1`` (CI sets it), hold every default port on loopback
    for the whole run, as a ``standalone`` on its defaults does: a test that binds one fails at
    once instead of only beside a running ``standalone``. Bound, not listening: a client
    dialling a default address is refused, as with nothing there. A port already taken (another
    xdist worker, another run, a real ``standalone``) is held by that one; this run goes on."""
    if os.environ.get("GPUSTACK_HOLD_DEFAULT_PORTS") != "1":
        yield
        return
    with contextlib.ExitStack() as held:
        for port in sorted(default_ports()):
            sock = held.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        yield

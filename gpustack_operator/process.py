"""The one process runner: every long-lived command runs under :func:`run_service`.

It owns what a process owns and nothing else does:

- the event loop (uvloop where it is installed, as in production; asyncio otherwise);
- the signals: the first SIGTERM or SIGINT cancels the service, whose parts unwind their own
  shielded, time-bounded cleanups (drain the outbox, close servers, unlink sockets); if that
  has not finished within the shutdown deadline, or a second signal arrives, the process exits
  at once. No other module installs a signal handler;
- the exit codes, and one actionable line per failure: exception groups are unwrapped, every
  error a layer owns (bus, agent, control plane, Hub, HTTPS endpoint, the OS) is logged as its
  message alone, and only a bug (anything else) logs a traceback.

Invariant: a service that returns on its own without an exit code (it should run until
cancelled) is logged and ends the process with :data:`EXIT_FAILED`, so a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from agent.errors import AgentError
from bus.errors import BusError
from controlplane.errors import ControlPlaneError
from hub.errors import HubError
from kit import files, heap
from kit.options import SettingsError
from kit.serving import ServingFailed

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SIGNALLED",
    "EXIT_USAGE",
    "SHUTDOWN_S",
    "Service",
    "run_service",
]

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
"""The command failed (or a service stopped on its own, or did not stop in time)."""
EXIT_USAGE = 2
"""The command line or the configuration it makes is wrong."""
EXIT_SIGNALLED = 130
"""A second signal ended the process before its cleanup finished."""

SHUTDOWN_S = 4.0
"""Seconds a service has to stop after the first signal: inside a pod's grace period, and
inside the 5 s the tests allow a PID 1."""

FAILURES: tuple[type[BaseException], ...] = (
    AgentError,
    BusError,
    ControlPlaneError,
    HubError,
    ServingFailed,
    OSError,
)
"""Errors that mean "this run failed for a reason a person can act on": one line, exit 1."""


@dataclass(frozen=True)
class Service:
    """A long-lived command: its name (for logs) and the coroutine that runs it until cancelled.

    ``main`` returns only to end the process on purpose, with an ``int`` exit code (``standalone
    --run-for``); returning anything else means it stopped on its own, which is a failure.
    """

    name: str
    main: Callable[[], Awaitable[object]]
    shutdown_s: float = SHUTDOWN_S


def run_service(service: Service) -> int:
    """Run ``service`` until a signal stops it; return the process's exit code."""
    try:
        return anyio.run(_supervise, service, backend_options=_backend_options())
    except BaseException as e:  # noqa: BLE001 - the one place every failure becomes a code
        return exit_code_for(service.name, e)


def exit_code_for(name: str, error: BaseException) -> int:
    """Log ``error`` (a group is unwrapped) as the person running ``name`` needs it."""
    leaves = list(_leaves(error))
    if all(isinstance(e, KeyboardInterrupt) for e in leaves):
        return EXIT_OK
    for leaf in leaves:
        if isinstance(leaf, SettingsError):  # found only once running: still the flag's fault
            log.error("%s: %s", name, leaf)
            return EXIT_USAGE
        if isinstance(leaf, FAILURES):
            log.error("%s: %s", name, _message(leaf))
        elif not isinstance(leaf, (KeyboardInterrupt, asyncio.CancelledError)):
            # asyncio's class, not anyio.get_cancelled_exc_class(): this runs after the loop
            # has ended, where anyio has no backend to ask (and every backend here is asyncio).
            log.error("%s: unexpected failure", name, exc_info=leaf)
    return EXIT_FAILED


def _backend_options() -> dict[str, object]:
    return {"use_uvloop": importlib.util.find_spec("uvloop") is not None}


async def _supervise(service: Service) -> int:
    """Run the service beside the signal watcher; the watcher outlives the service's scope."""
    outcome: list[int] = []
    deadline: list[threading.Timer] = []
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def body() -> None:
                with scope:
                    result = await service.main()
                    if isinstance(result, int):
                        outcome.append(result)
                    else:
                        log.error("%s stopped on its own; it runs until stopped", service.name)
                        outcome.append(EXIT_FAILED)
                tg.cancel_scope.cancel()  # the service is done: stop watching signals

            tg.start_soon(body, name=service.name)
            tg.start_soon(heap.trim_heap, name="trim the heap")  # docs: kit/heap.py
            try:
                async for signum in signals:
                    _on_signal(service, scope, signum, deadline)
            finally:
                for timer in deadline:
                    timer.cancel()
    return outcome[0] if outcome else EXIT_OK


def _on_signal(
    service: Service, scope: anyio.CancelScope, signum: int, deadline: list[threading.Timer]
) -> None:
    name = signal.Signals(signum).name
    if scope.cancel_called:
        log.warning("%s received again; exiting now", name)
        _exit_now(EXIT_SIGNALLED)
    log.info("%s received; stopping %s (again to exit at once)", name, service.name)
    scope.cancel()
    deadline.append(_exit_after(service))


def _exit_after(service: Service) -> threading.Timer:
    """Exit at once if the cleanup outlives the shutdown deadline.

    A thread, not a loop timer: a part that blocks the event loop must not outlive it either.
    """

    def expire() -> None:
        log.error("%s did not stop within %.1f s; exiting", service.name, service.shutdown_s)
        _exit_now(EXIT_FAILED)

    timer = threading.Timer(service.shutdown_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def _exit_now(code: int) -> None:
    logging.shutdown()
    os._exit(code)


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _leaves(e)]
    return [error]


def _message(error: BaseException) -> str:
    """One line for ``error``; an OS error is said in words with its path (``no space left on
    the device holding <path>``), never as a bare ``[Errno N]``."""
    bare = str(error).startswith("[Errno")  # the form that says no more than the errno
    if isinstance(error, OSError) and bare and error.filename is not None:
        return files.reason(error)
    text = str(error) or type(error).__name__
    if isinstance(error, OSError) and error.filename and str(error.filename) not in text:
        text = f"{text}: {error.filename}"
    return text

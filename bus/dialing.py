"""Opening a NATS client: options, TLS, the dialing loop and its retry decision.

The first part of the transport (:mod:`bus.connection` and :mod:`bus.jetstream` hold the
operations); these three are the only modules that import ``nats``, and share the error mapping
(:func:`mapped`) and the cleanup step (:func:`quietly`) defined here.

:func:`open_client` dials until a server accepts (or fails at once, for CLI tools), backing off
with jitter (:func:`next_attempt`, pure). A client it returns never reconnects by itself: when
its connection ends it closes, and :func:`bus.connection.connect` replaces it with a new one
from here. One path for every way a connection ends (server restart, network loss, a stale
connection, "Authorization Violation" from an auth callout that timed out), instead of
nats-py's reconnect loop, which gives up for good on the last one. Every replacement is counted
in a :class:`Reconnects`: the work a reconnect calls for runs in its owners' tasks.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import anyio
import nats
import nats.errors
from nats.aio.client import Client

from bus.errors import BusError, NotConnected
from bus.settings import BusSettings, tls_context
from kit import backoff
from kit.redaction import redact_urls

__all__ = [
    "MAX_BACKOFF_S",
    "Reconnects",
    "close_client",
    "mapped",
    "next_attempt",
    "open_client",
    "quietly",
]

log = logging.getLogger(__name__)

MAX_BACKOFF_S: Final = 30.0
"""The longest wait between two dialing rounds (before jitter: drawn from 15-30 s)."""
_PING_INTERVAL_S: Final = 30
_MAX_OUTSTANDING_PINGS: Final = 2
"""A connection whose server stopped answering (a silent network loss) is found stale, and
replaced, within about ``(2 + 1) * 30 s``; nats-py's defaults (2 min, 2) took six minutes."""


class Reconnects:
    """Counts the connection's reconnects (a new client in place of a closed one) and tells
    whoever listens.

    :meth:`fire` only counts, calls the registered callbacks (which must neither block nor
    raise: they note, wake, and return) and wakes the waiters; the work a reconnect calls for
    runs in its owners' tasks.
    """

    def __init__(self) -> None:
        self.count = 0
        self._event = anyio.Event()
        self.callbacks: set[Callable[[], None]] = set()

    def fire(self) -> None:
        self.count += 1
        for callback in list(self.callbacks):
            callback()
        self._event, event = anyio.Event(), self._event
        event.set()

    async def wait(self, seen: int) -> int:
        """Until more than ``seen`` reconnects happened; returns the count."""
        while self.count <= seen:
            await self._event.wait()
        return self.count


_NOT_CONNECTED: Final = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoServersError,
)


@contextmanager
def mapped(failure: type[BusError], what: str) -> Iterator[None]:
    """Translate ``nats`` errors raised inside the block into bus errors."""
    try:
        yield
    except _NOT_CONNECTED as e:
        raise NotConnected(f"{what}: not connected") from e
    except (nats.errors.Error, OSError) as e:
        raise failure(f"{what}: {type(e).__name__}: {e}") from e


async def quietly(aw: Awaitable[object]) -> None:
    """Await a cleanup step; a failure of the client there is logged, never raised."""
    try:
        await aw
    except (nats.errors.Error, OSError) as e:
        log.debug("ignored during cleanup: %r", e)


_CLOSE_TIMEOUT_S: Final = 5.0
_CLIENT_TASKS = ("_reconnection_task", "_reading_task", "_ping_interval_task", "_flusher_task")
"""nats-py's own background tasks (private names, read only here, in the one adapter)."""


async def close_client(nc: Client) -> None:
    """Close ``nc``; whatever the close itself fails on, none of the client's tasks outlives it.

    nats-py's ``close()`` flushes before it stops its reconnect loop and subscriptions, so a
    transport that died under it (``RuntimeError: … the handler is closed``) aborted the close
    and left those tasks running for the life of the process.
    """
    if getattr(nc, "_flush_queue", None) is None:
        _abandon(nc)  # never connected: nats-py's close() asserts it was
        return
    try:
        # Bounded: the close writes what is pending first, and a server that does not read
        # (one still waiting for its auth callout) would hold it until its own timeout.
        with anyio.fail_after(_CLOSE_TIMEOUT_S):
            await nc.close()
    except (nats.errors.Error, OSError, RuntimeError, TimeoutError) as e:
        log.debug("close failed half-way (%r); stopping the client's tasks", e)
        _abandon(nc)
    else:
        # A no-op after a complete close; but nats-py may have been closing the client in its
        # reader task (a lost connection), which this cancels before it closed the transport.
        _abandon(nc)


class _Client(Client):
    """nats-py's client, whose own close never fails on a transport that died under it, and
    whose connection survives a flush that timed out.

    nats-py closes a client from a task of its own when the server ends the connection with an
    error ("Authorization Violation"); that close writes what was pending to the transport
    first, which raises (``RuntimeError: … the handler is closed`` on uvloop) when the server
    already hung up, an exception no one would ever retrieve. The client is closed all the
    same (its status says so first): what the close did not get to is cancelled here, and
    the connection's keeper, which also looks for itself, replaces the client.
    """

    async def _process_pong(self) -> None:
        """As nats-py's, but the PONG of a flush that timed out (its future cancelled by the
        timeout) is taken as it is: nats-py set its result anyway, and the reader's
        ``InvalidStateError`` ended the connection, so a slow server made every flush with a
        timeout cost a connection."""
        if self._pongs:
            future = self._pongs.pop(0)
            if not future.done():
                future.set_result(True)
            self._pongs_received += 1
            self._pings_outstanding = 0

    async def _close(self, status: int, do_cbs: bool = True) -> None:
        try:
            await super()._close(status, do_cbs)
        except (nats.errors.Error, OSError, RuntimeError) as e:
            log.debug("the client's close failed half-way (%r); stopping its tasks", e)
            _abandon(self)


def _abandon(nc: Client) -> None:
    """Stop what an aborted close left: the client's loops, every subscription's task, and
    its transport (left open when the close failed writing to it, or was cancelled)."""
    for sub in list(getattr(nc, "_subs", {}).values()):
        _cancel(getattr(sub, "_wait_for_msgs_task", None))
        iterator = getattr(sub, "_message_iterator", None)
        if iterator is not None:
            iterator._cancel()
    for name in _CLIENT_TASKS:
        _cancel(getattr(nc, name, None))
    opened = getattr(nc, "_transport", None)
    if opened is not None and _still_open(opened):
        try:
            opened.close()
        except (OSError, RuntimeError) as e:  # already closed under it
            log.debug("ignored while closing a transport: %r", e)


def _still_open(transport: object) -> bool:
    """Whether nats-py's TCP (a stream writer) or WebSocket transport is not closed yet; a
    WebSocket close starts a task, so it is never started twice."""
    writer = getattr(transport, "_io_writer", None)
    if writer is not None:
        return not writer.is_closing()
    ws = getattr(transport, "_ws", None)
    return ws is not None and not ws.closed and getattr(transport, "_close_task", None) is None


def _cancel(task: object) -> None:
    if isinstance(task, asyncio.Task) and not task.done():
        task.cancel()


def _token_reader(path: str) -> Callable[[], str]:
    """Read the token file at every (re)connection: kubelet rotates projected tokens in place."""

    def read() -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            log.warning("cannot read the NATS token file %s: %s", path, e)
            return ""  # the server refuses the connection; the next attempt reads again

    return read


def _options(
    settings: BusSettings,
    name: str | None,
    errors: list[Exception],
    closed: Callable[[], None],
) -> dict[str, Any]:
    async def on_error(e: Exception) -> None:
        errors.append(e)
        log.warning("bus connection error: %r", e)

    async def on_closed() -> None:
        closed()

    options: dict[str, Any] = {
        "servers": settings.servers,
        "name": name,
        "connect_timeout": settings.connect_timeout_s,
        "reconnect_time_wait": settings.reconnect_wait_s,
        # One try per server and round (our loop backs off between rounds); once connected,
        # the client does not reconnect by itself (see open_client).
        "max_reconnect_attempts": 1,
        "allow_reconnect": True,
        "ping_interval": _PING_INTERVAL_S,
        "max_outstanding_pings": _MAX_OUTSTANDING_PINGS,
        "drain_timeout": settings.drain_timeout_s,
        "error_cb": on_error,
        "closed_cb": on_closed,
        "tls": tls_context(settings),
        "inbox_prefix": settings.inbox_prefix,
    }
    optional = {
        "user": settings.user,
        "password": settings.password,
        "token": _token_reader(settings.token_file) if settings.token_file else settings.token,
        "nkeys_seed": settings.nkey_seed_file,
        "user_credentials": settings.creds_file,
    }
    options.update({k: v for k, v in optional.items() if v is not None})
    return options


def next_attempt(
    failures: int, *, retry: bool, settings: BusSettings, rng: random.Random | None = None
) -> float | None:
    """The retry decision: seconds to wait after ``failures`` failed rounds in a row, or None
    to give up (only when ``retry`` is false). Whatever the failure was (refused, timed out,
    "Authorization Violation" because the auth callout did not answer in time), a retrying
    caller tries again, for ever: the jittered backoff spreads a fleet that lost the same
    server at the same moment."""
    if not retry:
        return None
    return backoff.jittered(
        failures, first_s=settings.reconnect_wait_s, max_s=MAX_BACKOFF_S, rng=rng
    )


async def open_client(
    settings: BusSettings, name: str | None, *, retry: bool, closed: Callable[[], None]
) -> Client:
    """A connected client; ``retry``: try forever (see :func:`next_attempt`), else fail at once.

    The client does not reconnect by itself: when its connection ends, whatever the cause, it
    closes and calls ``closed()`` (from the client's task: it must not block or raise), and its
    owner opens another one (:func:`bus.connection.connect`). nats-py's own reconnect gives up
    for good on an "Authorization Violation" (an auth callout that timed out while the worker
    re-subscribed after a server restart), which left agents off the bus for ever.

    :raises NotConnected: only when ``retry`` is false and no server answered.
    """
    shown = redact_urls(settings.url)  # warned on every round: never with its password
    failures = 0
    while True:
        seen: list[Exception] = []
        try:
            return await _dial(settings, _options(settings, name, seen, closed))
        except (nats.errors.Error, OSError, TimeoutError) as e:
            cause = seen[-1] if seen else e  # the client's own error says more than a timeout
            failures += 1
            wait = next_attempt(failures, retry=retry, settings=settings)
            if wait is None:
                raise NotConnected(f"cannot connect to {shown}: {cause!r}") from e
            log.warning("cannot connect to %s (%r); retrying in %.1fs", shown, cause, wait)
            await anyio.sleep(wait)


async def _dial(settings: BusSettings, options: dict[str, Any]) -> Client:
    """One round over the servers; the client is closed again unless it connected."""
    nc = _Client()
    # nats-py can wait forever on a failed TLS handshake: bound each round ourselves.
    bound = settings.connect_timeout_s * (2 * len(settings.servers) + 1)
    try:
        with anyio.fail_after(bound):
            await nc.connect(**options)
    except BaseException:  # failed, or cancelled mid-connect: close the half-open client
        with anyio.CancelScope(shield=True):
            await close_client(nc)
        raise
    # nats-py has one setting for the first connection and later ones, and would reconnect
    # by itself from now on: a connection that ends closes instead, and its owner redials.
    nc.options["allow_reconnect"] = False
    return nc

"""Opening a NATS client: options, TLS, the first-connection retry loop, reconnect notices.

The first part of the transport (:mod:`bus.connection` and :mod:`bus.jetstream` hold the
operations); these three are the only modules that import ``nats``, and share the error mapping
(:func:`mapped`) and the cleanup step (:func:`quietly`) defined here. :func:`open_client` retries the first connection with
capped exponential backoff (or fails at once for CLI tools), then lets the client reconnect
forever. Every reconnect is counted in a :class:`Reconnects`, which is all the client's
callback does: the work a reconnect calls for runs in its owners' tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import anyio
import nats
import nats.errors
from nats.aio.client import Client

from bus.errors import BusError, NotConnected
from bus.settings import BusSettings, tls_context
from kit.redaction import redact_urls

__all__ = ["Reconnects", "close_client", "mapped", "open_client", "quietly"]

log = logging.getLogger(__name__)

_MAX_CONNECT_BACKOFF_S: Final = 30.0


class Reconnects:
    """Counts the client's reconnects and tells whoever listens.

    :meth:`fire` runs in the client's reconnect callback: it only counts, calls the registered
    callbacks (which must neither block nor raise: they note, wake, and return) and wakes the
    waiters; the work a reconnect calls for runs in its owners' tasks.
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
        await nc.close()
    except (nats.errors.Error, OSError, RuntimeError) as e:
        log.debug("close failed half-way (%r); stopping the client's tasks", e)
        _abandon(nc)
    else:
        _abandon(nc)  # a no-op after a complete close


def _abandon(nc: Client) -> None:
    """Cancel what an aborted close left: the client's loops and every subscription's task."""
    for sub in list(getattr(nc, "_subs", {}).values()):
        _cancel(getattr(sub, "_wait_for_msgs_task", None))
        iterator = getattr(sub, "_message_iterator", None)
        if iterator is not None:
            iterator._cancel()
    for name in _CLIENT_TASKS:
        _cancel(getattr(nc, name, None))


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
    errors: list[Exception] | None = None,
    reconnects: Reconnects | None = None,
) -> dict[str, Any]:
    async def on_error(e: Exception) -> None:
        if errors is not None:
            errors.append(e)
        log.warning("bus connection error: %r", e)

    async def on_disconnected() -> None:
        log.info("bus disconnected")

    async def on_reconnected() -> None:
        log.info("bus reconnected")
        if reconnects is not None:
            reconnects.fire()

    options: dict[str, Any] = {
        "servers": settings.servers,
        "name": name,
        "connect_timeout": settings.connect_timeout_s,
        "reconnect_time_wait": settings.reconnect_wait_s,
        # One try per server for the first connection (our loop in _open backs off between
        # rounds); raised to "forever" once connected, see _open.
        "max_reconnect_attempts": 1,
        "allow_reconnect": True,
        "drain_timeout": settings.drain_timeout_s,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
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


async def open_client(
    settings: BusSettings, name: str | None, retry: bool, reconnects: Reconnects
) -> Client:
    """A connected client; ``retry``: try the first connection forever, else fail at once.

    :raises NotConnected: only when ``retry`` is false and no server answered.
    """
    attempt = 0
    shown = redact_urls(settings.url)  # warned on every round: never with its password
    while True:
        nc = Client()
        # nats-py can wait forever on a failed TLS handshake: bound each round ourselves.
        bound = settings.connect_timeout_s * (2 * len(settings.servers) + 1)
        seen: list[Exception] = []
        try:
            with anyio.fail_after(bound):
                await nc.connect(**_options(settings, name, seen, reconnects))
        except (nats.errors.Error, OSError, TimeoutError) as e:
            with anyio.CancelScope(shield=True):
                await close_client(nc)
            if not retry:
                cause = seen[-1] if seen else e  # the client's own error says more than a timeout
                raise NotConnected(f"cannot connect to {shown}: {cause!r}") from e
            delay = min(settings.reconnect_wait_s * 2**attempt, _MAX_CONNECT_BACKOFF_S)
            log.warning("cannot connect to %s (%r); retrying in %.1fs", shown, e, delay)
            attempt += 1
            await anyio.sleep(delay)
        except BaseException:  # cancelled mid-connect: close the half-open client, then go
            with anyio.CancelScope(shield=True):
                await close_client(nc)
            raise
        else:
            # nats-py has no separate setting for the first connection, and with -1 it would
            # spin inside connect() forever: switch to "reconnect forever" only now.
            nc.options["max_reconnect_attempts"] = -1
            return nc

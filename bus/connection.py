"""The NATS transport: with :mod:`bus.dialing` and :mod:`bus.jetstream`, the only modules that
import ``nats``.

:func:`connect` is an async context manager around one client connection. It retries the first
connection with capped exponential backoff and lets the client reconnect forever afterwards, so a
node agent started before the bus simply waits. Leaving the context drains the connection within
``settings.drain_timeout_s`` (shielded from cancellation), then closes it.

A :class:`Connection` does core NATS here (publish, request, subscribe, reconnect notices); its
JetStream halves are ``conn.streams`` and ``conn.buckets`` (:mod:`bus.jetstream`). A reconnect
may reach a server that lost its store (restarted empty): owners re-ensure what they need from
:meth:`Connection.every_reconnect`.

Every ``nats`` exception is mapped to a :mod:`bus.errors` type, chained with ``from e``.
Callers see bytes and subjects only; events are the codec's business.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio
import anyio.lowlevel
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from bus.dialing import Reconnects, close_client, mapped, open_client, quietly
from bus.errors import BusError, NoAnswer, NotConnected, PublishFailed
from bus.jetstream import Buckets, Streams
from bus.settings import BusSettings

__all__ = ["Connection", "connect"]


class Connection:
    """A connected NATS client in bus terms: core operations here, JetStream in ``streams`` and
    ``buckets``."""

    def __init__(self, nc: Client, settings: BusSettings, reconnects: Reconnects) -> None:
        self._nc = nc
        self._settings = settings
        self._reconnects = reconnects
        self._js = nc.jetstream(timeout=settings.request_timeout_s)
        self.streams = Streams(self._js, settings)
        """The JetStream streams: ensured by their owner, read whole by anyone."""
        self.buckets = Buckets(self._js, settings)
        """The key-value buckets (:mod:`bus.kv` is the typed API over them)."""

    async def every_reconnect(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook()`` after every reconnect, until cancelled.

        Not after the first connection (its owner set up then). The server reached may be
        another one, or the same one restarted with an empty store: a hook re-ensures what its
        owner needs there. Reconnects while a hook runs lead to one more call, not one each.
        """
        seen = self._reconnects.count
        while True:
            seen = await self._reconnects.wait(seen)
            await hook()

    @contextmanager
    def reconnect_callback(self, callback: Callable[[], None]) -> Iterator[None]:
        """Call ``callback()`` at every reconnect while inside; it must not block or raise.

        For owners without a task of their own to run :meth:`every_reconnect` in.
        """
        self._reconnects.callbacks.add(callback)
        try:
            yield
        finally:
            self._reconnects.callbacks.discard(callback)

    @property
    def is_connected(self) -> bool:
        """True while a server connection is up (False while reconnecting or closed)."""
        return bool(self._nc.is_connected)

    @property
    def connected_url(self) -> str | None:
        """The URL of the server currently connected to, if any."""
        url = self._nc.connected_url
        return None if url is None else url.geturl()

    def new_inbox(self) -> str:
        """A unique subject prefix for replies to this client (``_INBOX.<nuid>``)."""
        return self._nc.new_inbox()

    async def publish(self, subject: str, payload: bytes, *, reply: str = "") -> None:
        """Fire-and-forget publish (at most once); ``reply`` asks the receiver to answer there.

        :raises NotConnected: while reconnecting or after close.
        :raises PublishFailed: for any other client-side refusal (e.g. payload too large).
        """
        if not self._nc.is_connected:
            raise NotConnected("publish: not connected")
        with mapped(PublishFailed, f"publish {subject}"):
            await self._nc.publish(subject, payload, reply=reply)

    async def publish_acked(self, subject: str, payload: bytes) -> None:
        """Publish and wait for the stream's acknowledgement (stored, or raise).

        :raises NotConnected: while reconnecting or after close.
        :raises PublishFailed: no ack within ``request_timeout_s``, or no stream takes the subject.
        """
        if not self._nc.is_connected:
            raise NotConnected("publish: not connected")
        with mapped(PublishFailed, f"publish {subject}"):
            await self._js.publish(subject, payload, timeout=self._settings.request_timeout_s)

    async def flush(self) -> None:
        """Wait until the server has seen everything published so far.

        :raises NotConnected: while reconnecting or after close.
        :raises PublishFailed: when the server does not answer within ``request_timeout_s``.
        """
        with mapped(PublishFailed, "flush"):
            await self._nc.flush(timeout=max(1, round(self._settings.request_timeout_s)))

    async def request(self, subject: str, payload: bytes, *, timeout_s: float) -> bytes:
        """Publish ``payload`` as a request and return the first reply's payload.

        :raises NotConnected: while reconnecting or after close.
        :raises NoAnswer: nobody subscribes to ``subject`` (answered at once by the server), or
            no reply came within ``timeout_s``.
        """
        if not self._nc.is_connected:
            raise NotConnected(f"request {subject}: not connected")
        with mapped(NoAnswer, f"request {subject}"):
            try:
                msg = await self._nc.request(subject, payload, timeout=timeout_s)
            except nats.errors.NoRespondersError as e:
                raise NoAnswer(f"request {subject}: no responder") from e
            except nats.errors.TimeoutError as e:
                raise NoAnswer(f"request {subject}: no answer in {timeout_s}s") from e
        return bytes(msg.data)

    @asynccontextmanager
    async def subscribe(
        self, subject: str, on_message: Callable[[str, bytes], bool | None]
    ) -> AsyncIterator[None]:
        """Call ``on_message(subject, payload)`` for every message on ``subject`` while inside.

        ``on_message`` runs on the client's reader path: it must not block and must not raise.
        When it returns True, the client's delivery task yields to the other tasks once before
        the next message (it would not otherwise while messages are queued): a consumer that
        ``on_message`` hands messages to gets its turn, and the client's queue holds the rest.
        """

        async def callback(msg: Msg) -> None:
            if on_message(msg.subject, msg.data):
                await anyio.lowlevel.checkpoint()

        async with self._subscribed(subject, callback, queue=""):
            yield

    @asynccontextmanager
    async def serve_requests(
        self, subject: str, on_request: Callable[[bytes, str], None], *, queue: str
    ) -> AsyncIterator[None]:
        """Call ``on_request(payload, reply_subject)`` for every request on ``subject`` while
        inside; ``queue`` shares the requests among every subscriber of that queue group, so
        each request reaches one of them. Answer with :meth:`publish` to ``reply_subject``.

        ``on_request`` runs on the client's reader path: it must not block and must not raise.
        """

        async def callback(msg: Msg) -> None:
            on_request(msg.data, msg.reply)

        async with self._subscribed(subject, callback, queue=queue):
            yield

    @asynccontextmanager
    async def _subscribed(
        self, subject: str, callback: Callable[[Msg], Awaitable[None]], *, queue: str
    ) -> AsyncIterator[None]:
        with mapped(BusError, f"subscribe {subject}"):
            sub = await self._nc.subscribe(subject, queue=queue, cb=callback)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                if not self._nc.is_closed:
                    await quietly(sub.unsubscribe())


@asynccontextmanager
async def connect(
    settings: BusSettings, *, name: str | None = None, retry: bool = True
) -> AsyncIterator[Connection]:
    """Connect to the bus; drain and close on exit.

    :param name: the client name shown by the server's monitoring (e.g. ``agent/<node>``).
    :param retry: retry the first connection forever (agents) or fail at once (CLI tools).
    :raises NotConnected: only when ``retry`` is false and no server answered.
    """
    reconnects = Reconnects()
    nc = await open_client(settings, name, retry, reconnects)
    try:
        yield Connection(nc, settings, reconnects)
    finally:
        with anyio.move_on_after(settings.drain_timeout_s, shield=True):
            if nc.is_connected:
                await quietly(nc.drain())
        with anyio.CancelScope(shield=True):
            await close_client(nc)

"""The NATS transport: with :mod:`bus.dialing` and :mod:`bus.jetstream`, the only modules that
import ``nats``.

:func:`connect` is an async context manager around one :class:`Connection`: a stable face over
a succession of NATS clients. It dials the first one (retrying forever, or failing at once for
CLI tools), then keeps the connection up for as long as the block runs: whenever the client's
connection ends (server restart, network loss, a stale connection, an auth callout that timed
out and answered "Authorization Violation"), the client closes and a task of the context
replaces it with a new one (:func:`bus.dialing.open_client`: jittered backoff, for ever). On
the new client it subscribes again to every subscription still open and rebinds the JetStream
halves, then tells the owners (:meth:`Connection.every_reconnect`), who re-ensure what they
need there: the server reached may be another one, or the same one restarted with an empty
store. Leaving the context drains the connection within ``settings.drain_timeout_s``
(shielded from cancellation), then closes it.

A :class:`Connection` does core NATS here (publish, request, subscribe, reconnect notices); its
JetStream halves are ``conn.streams`` and ``conn.buckets`` (:mod:`bus.jetstream`). Its
:class:`~bus.presence.Presence` says how long it has been off the bus (agents' ``/livez``).

Every ``nats`` exception is mapped to a :mod:`bus.errors` type, chained with ``from e``.
Callers see bytes and subjects only; events are the codec's business.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Final

import anyio
import anyio.lowlevel
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bus.dialing import Reconnects, close_client, mapped, next_attempt, open_client, quietly
from bus.errors import BusError, NoAnswer, NotConnected, PublishFailed
from bus.jetstream import Buckets, Streams
from bus.presence import Presence
from bus.settings import BusSettings

__all__ = ["Connection", "connect"]

log = logging.getLogger(__name__)

_CHECK_S: Final = 1.0
"""How often the keeper looks at its client besides being told it closed: nats-py does not
call its close callback for every way a client ends."""


class _Signal:
    """Set by the client's close callback (any client of the connection), awaited by the
    keeper with a timeout; a spurious one only makes it look again."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        with anyio.move_on_after(timeout_s):
            await self._event.wait()
        self._event = anyio.Event()


class _Registered:
    """One open subscription, made again on every new client.

    ``client`` is set before the subscribe is awaited, so the keeper and the subscriber never
    both subscribe it on the same client.
    """

    def __init__(self, subject: str, queue: str, callback: Callable[[Msg], Awaitable[None]]):
        self.subject, self.queue, self.callback = subject, queue, callback
        self.client: Client | None = None
        self.sub: Subscription | None = None


class Connection:
    """A connected NATS client in bus terms: core operations here, JetStream in ``streams`` and
    ``buckets``. The client underneath is replaced whenever it is lost (see the module)."""

    def __init__(
        self,
        nc: Client,
        settings: BusSettings,
        *,
        reconnects: Reconnects,
        presence: Presence,
        closed: _Signal,
    ) -> None:
        self._nc = nc
        self._settings = settings
        self._reconnects = reconnects
        self._closed = closed
        self.presence = presence
        """On the bus or not, and since when not (``/livez``)."""
        self._registered: dict[int, _Registered] = {}
        self._js = nc.jetstream(timeout=settings.request_timeout_s)
        self.streams = Streams(self._js, settings)
        """The JetStream streams: ensured by their owner, read whole by anyone."""
        self.buckets = Buckets(self._js, settings)
        """The key-value buckets (:mod:`bus.kv` is the typed API over them)."""

    async def every_reconnect(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook()`` after every reconnect, until cancelled.

        Not after the first connection (its owner set up then). A reconnect is a new client,
        connected and subscribed again to every open subscription. The server reached may be
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
        """True while a server connection is up (False while a lost client is being replaced,
        or after close)."""
        return bool(self._nc.is_connected)

    @property
    def reconnects(self) -> int:
        """How many times the client was replaced since the first connection."""
        return self._reconnects.count

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
        """Wait until the server has seen everything published or subscribed so far.

        Two round trips, not one: nats-py writes a flush's PING straight to the socket while
        the commands before it (a SUB, a PUB) still wait for its flusher task, so the first
        PONG can answer before the server read them. That first round trip lets the flusher
        write them; the second PING follows them on the wire, and the server answers in order.

        :raises NotConnected: while reconnecting or after close.
        :raises PublishFailed: when the server does not answer within ``request_timeout_s``.
        """
        timeout = max(1, round(self._settings.request_timeout_s))
        with mapped(PublishFailed, "flush"):
            await self._nc.flush(timeout=timeout)
            await self._nc.flush(timeout=timeout)

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
        """Subscribed on the current client and on every one replacing it, while inside.

        Entered while no client is connected, the subscription is made on the next one.
        """
        reg = _Registered(subject, queue, callback)
        await self._subscribe(reg)
        self._registered[id(reg)] = reg
        try:
            yield
        finally:
            del self._registered[id(reg)]
            with anyio.CancelScope(shield=True):
                if reg.sub is not None and reg.client is self._nc and not self._nc.is_closed:
                    await quietly(reg.sub.unsubscribe())

    async def _subscribe(self, reg: _Registered) -> None:
        """Subscribe ``reg`` on the current client, unless it is already or the client is lost.

        :raises BusError: the client refused the subscription (e.g. an invalid subject).
        """
        nc = self._nc
        if reg.client is nc or nc.is_closed:
            return
        reg.client = nc
        try:
            with mapped(BusError, f"subscribe {reg.subject}"):
                reg.sub = await nc.subscribe(reg.subject, queue=reg.queue, cb=reg.callback)
        except NotConnected:
            reg.client = None  # lost meanwhile: the next client subscribes it
        except BaseException:
            reg.client = None
            raise

    async def _keep(self, name: str | None) -> None:
        """Replace the client whenever it is lost, until cancelled (the keeper task)."""
        while True:
            await self._until_lost()
            self.presence.lost(anyio.current_time())
            log.warning("bus connection lost (%r); connecting again", self._nc.last_error)
            with anyio.CancelScope(shield=True):
                # nats-py's own close may have stopped half-way (a transport that died under
                # it), leaving the subscriptions' tasks running: none outlives the client.
                await close_client(self._nc)
            await self._replace(name)
            self.presence.connected()
            log.info("bus connected again (%s)", self.connected_url)
            self._reconnects.fire()

    async def _until_lost(self) -> None:
        """Until the client is closed, or has been neither connected nor closed for longer
        than ``connect_timeout_s`` (a state nats-py can leave a client in once its own
        reconnect is off): either way it is lost, and replaced."""
        adrift_since: float | None = None
        while not self._nc.is_closed:
            now = anyio.current_time()
            if self._nc.is_connected:
                adrift_since = None
            elif adrift_since is None:
                adrift_since = now
            elif now - adrift_since > self._settings.connect_timeout_s:
                return
            await self._closed.wait(_CHECK_S)

    async def _replace(self, name: str | None) -> None:
        """A new client in place of the closed one: subscribed again, JetStream rebound."""
        failures = 0
        while True:
            nc = await open_client(self._settings, name, retry=True, closed=self._closed.set)
            self._nc = nc
            self._js = nc.jetstream(timeout=self._settings.request_timeout_s)
            self.streams.rebind(self._js)
            self.buckets.rebind(self._js)
            try:
                for reg in list(self._registered.values()):
                    await self._subscribe(reg)
            except BusError as e:
                log.warning("cannot subscribe again on the new bus connection: %s", e)
            else:
                # The server has every subscription before anyone is told (a slow answer is
                # no reason to drop a connected client: it processes them in order anyway).
                with contextlib.suppress(BusError):
                    await self.flush()
                if nc.is_connected:
                    return
            with anyio.CancelScope(shield=True):
                await close_client(nc)
            failures += 1
            await anyio.sleep(next_attempt(failures, retry=True, settings=self._settings) or 0)


@asynccontextmanager
async def connect(
    settings: BusSettings,
    *,
    name: str | None = None,
    retry: bool = True,
    presence: Presence | None = None,
) -> AsyncIterator[Connection]:
    """Connect to the bus and stay connected while inside; drain and close on exit.

    :param name: the client name shown by the server's monitoring (e.g. ``agent/<node>``).
    :param retry: retry the first connection forever (agents) or fail at once (CLI tools).
        Once connected, a lost client is replaced for ever either way.
    :param presence: told when the connection is up and when it is lost (a process's own,
        created at its start, so that the time before the first connection counts too);
        ``conn.presence`` either way.
    :raises NotConnected: only when ``retry`` is false and no server answered.
    """
    presence = presence or Presence(since=anyio.current_time())
    closed = _Signal()
    nc = await open_client(settings, name, retry=retry, closed=closed.set)
    conn = Connection(nc, settings, reconnects=Reconnects(), presence=presence, closed=closed)
    presence.connected()
    failed: Exception | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn._keep, name, name="bus-keeper")
            try:
                yield conn
            except Exception as e:  # noqa: BLE001 - the block's own error, raised as is below (not in a group)
                failed = e
            finally:
                tg.cancel_scope.cancel()
        if failed is not None:
            raise failed
    finally:
        nc = conn._nc  # the current client (the keeper may have replaced the first one)
        with anyio.move_on_after(settings.drain_timeout_s, shield=True):
            if nc.is_connected:
                await quietly(nc.drain())
        with anyio.CancelScope(shield=True):
            await close_client(nc)
        presence.lost(anyio.current_time())

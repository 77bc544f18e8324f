"""The NATS transport: with :mod:`bus.dialing`, the only modules that import ``nats``.

:func:`connect` is an async context manager around one client connection. It retries the first
connection with capped exponential backoff and lets the client reconnect forever afterwards, so a
node agent started before the bus simply waits. Leaving the context drains the connection within
``settings.drain_timeout_s`` (shielded from cancellation), then closes it.

A reconnect may reach a server that lost its store (restarted empty): owners re-ensure what they
need from :meth:`Connection.every_reconnect`, and a bucket found gone is created again on the
spot (:meth:`Connection.kv_ensure` remembers how).

Every ``nats`` exception is mapped to a :mod:`bus.errors` type here, chained with ``from e``.
Callers see bytes and subjects only; events are the codec's business.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from bus.dialing import Reconnects, close_client, open_client, quietly
from bus.errors import (
    BusError,
    KeyConflict,
    NoAnswer,
    NotConnected,
    PublishFailed,
    StateUnavailable,
)
from bus.settings import BusSettings

__all__ = ["Connection", "RawMessage", "connect"]

log = logging.getLogger(__name__)

T = TypeVar("T")
RawMessage = tuple[str, bytes]
"""A received message before decoding: ``(subject, payload)``."""

_NOT_CONNECTED: Final = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoServersError,
)


@contextmanager
def _mapped(failure: type[BusError], what: str) -> Iterator[None]:
    """Translate ``nats`` errors raised inside the block into bus errors."""
    try:
        yield
    except _NOT_CONNECTED as e:
        raise NotConnected(f"{what}: not connected") from e
    except (nats.errors.Error, OSError) as e:
        raise failure(f"{what}: {type(e).__name__}: {e}") from e


class Connection:
    """A connected NATS client with core and JetStream operations, in bus terms."""

    def __init__(self, nc: Client, settings: BusSettings, reconnects: Reconnects) -> None:
        self._nc = nc
        self._js = nc.jetstream(timeout=settings.request_timeout_s)
        self._settings = settings
        self._kv: dict[str, Any] = {}
        self._kv_config: dict[str, tuple[int, int]] = {}
        self._reconnects = reconnects

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
        with _mapped(PublishFailed, f"publish {subject}"):
            await self._nc.publish(subject, payload, reply=reply)

    async def publish_acked(self, subject: str, payload: bytes) -> None:
        """Publish and wait for the stream's acknowledgement (stored, or raise).

        :raises NotConnected: while reconnecting or after close.
        :raises PublishFailed: no ack within ``request_timeout_s``, or no stream takes the subject.
        """
        if not self._nc.is_connected:
            raise NotConnected("publish: not connected")
        with _mapped(PublishFailed, f"publish {subject}"):
            await self._js.publish(subject, payload, timeout=self._settings.request_timeout_s)

    async def flush(self) -> None:
        """Wait until the server has seen everything published so far.

        :raises NotConnected: while reconnecting or after close.
        :raises PublishFailed: when the server does not answer within ``request_timeout_s``.
        """
        with _mapped(PublishFailed, "flush"):
            await self._nc.flush(timeout=max(1, round(self._settings.request_timeout_s)))

    async def request(self, subject: str, payload: bytes, *, timeout_s: float) -> bytes:
        """Publish ``payload`` as a request and return the first reply's payload.

        :raises NotConnected: while reconnecting or after close.
        :raises NoAnswer: nobody subscribes to ``subject`` (answered at once by the server), or
            no reply came within ``timeout_s``.
        """
        if not self._nc.is_connected:
            raise NotConnected(f"request {subject}: not connected")
        with _mapped(NoAnswer, f"request {subject}"):
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
        with _mapped(BusError, f"subscribe {subject}"):
            sub = await self._nc.subscribe(subject, queue=queue, cb=callback)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                if not self._nc.is_closed:
                    await quietly(sub.unsubscribe())

    async def ensure_stream(
        self,
        name: str,
        subjects: list[str],
        *,
        max_msgs_per_subject: int,
        max_age_s: float | None,
        replicas: int,
        max_bytes: int = -1,
        max_msg_size: int = -1,
    ) -> None:
        """Create the stream, or bring an existing one to this configuration (idempotent).

        ``-1`` (and ``max_age_s=None``) mean unlimited; when full, the oldest messages go.

        :raises StateUnavailable: JetStream is disabled, or the request failed or timed out.
        """
        config = api.StreamConfig(
            name=name,
            subjects=subjects,
            storage=api.StorageType.FILE,
            max_msgs_per_subject=max_msgs_per_subject,
            max_age=max_age_s,
            max_bytes=max_bytes,
            max_msg_size=max_msg_size,
            discard=api.DiscardPolicy.OLD,
            num_replicas=replicas,
            allow_direct=True,
            deny_delete=True,
        )
        with _mapped(StateUnavailable, f"stream {name}"):
            try:
                await self._js.add_stream(config)
            except nats.js.errors.BadRequestError:
                # Exists with another configuration (an older release's limits, a changed max
                # age): update it in place; its messages stay.
                await self._js.update_stream(config)

    async def stream_config(self, name: str) -> dict[str, Any]:
        """The stream's configuration as the server reports it (durations in seconds).

        :raises StateUnavailable: the stream does not exist or does not answer.
        """
        with _mapped(StateUnavailable, f"stream {name}"):
            info = await self._js.stream_info(name)
        config: dict[str, Any] = info.config.as_dict()
        config["max_age"] = info.config.max_age
        return config

    async def last_per_subject(self, stream: str, filter_subject: str) -> list[RawMessage]:
        """The last retained message of every subject of ``stream`` matching ``filter_subject``.

        :raises StateUnavailable: the stream does not exist or does not answer.
        """
        return await self._retained(stream, filter_subject, api.DeliverPolicy.LAST_PER_SUBJECT)

    async def all_retained(self, stream: str, filter_subject: str) -> list[RawMessage]:
        """Every retained message of ``stream`` matching ``filter_subject``, oldest first.

        :raises StateUnavailable: the stream does not exist or does not answer.
        """
        return await self._retained(stream, filter_subject, api.DeliverPolicy.ALL)

    async def _retained(
        self, stream: str, filter_subject: str, policy: api.DeliverPolicy
    ) -> list[RawMessage]:
        return [(m.subject, m.data) for m in await self._pull(stream, filter_subject, policy)]

    async def _pull(self, stream: str, filter_subject: str, policy: api.DeliverPolicy) -> list[Msg]:
        config = api.ConsumerConfig(
            deliver_policy=policy,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
        )
        with _mapped(StateUnavailable, f"read {stream}"):
            # Shielded (bounded by the request timeout): a subscribe cancelled half-way would
            # leave its subscription behind with nobody to unsubscribe it.
            with anyio.CancelScope(shield=True):
                psub = await self._js.pull_subscribe(filter_subject, stream=stream, config=config)
            try:
                return await self._drain_pull(psub)
            finally:
                with anyio.CancelScope(shield=True):
                    await quietly(psub.unsubscribe())

    # --- JetStream key-value buckets (see bus.kv for the typed API and key layout) -------------

    async def kv_ensure(
        self, bucket: str, *, history: int = 1, replicas: int = 1, create: bool = True
    ) -> bool:
        """Create the key-value bucket, or bind to it when it exists; True when it was created.

        Remembered: an operation that later finds the bucket gone (a server restarted with an
        empty store) creates it again with this configuration and retries once (when
        ``create``).

        :param create: False only binds: for readers that may not create buckets (the agents).
        :raises StateUnavailable: JetStream is disabled, the request failed, or the bucket does
            not exist and ``create`` is false.
        """
        if create:
            self._kv_config[bucket] = (history, replicas)
        with _mapped(StateUnavailable, f"bucket {bucket}"):
            try:
                kv = await self._js.key_value(bucket)
                if create and not kv._direct:  # a bucket of an older version: direct gets on
                    info = await self._js.stream_info(f"KV_{bucket}")
                    await self._js.update_stream(info.config.evolve(allow_direct=True))
                    kv = await self._js.key_value(bucket)
                self._kv[bucket] = kv
                return False
            except nats.js.errors.BucketNotFoundError:
                if not create:
                    raise StateUnavailable(f"bucket {bucket} does not exist (yet)") from None
                # Direct gets name the key in the request subject, so the server can restrict
                # which keys a reader may get (an agent: its own node's).
                self._kv[bucket] = await self._js.create_key_value(
                    bucket=bucket, history=history, replicas=replicas, direct=True
                )
                return True

    async def kv_get(self, bucket: str, key: str) -> tuple[bytes, int] | None:
        """``(value, revision)`` of ``key``, or None when absent or deleted."""

        async def get() -> tuple[bytes, int] | None:
            with _mapped(StateUnavailable, f"get {bucket}/{key}"):
                try:
                    entry = await self._bucket(bucket).get(key)
                except nats.js.errors.KeyNotFoundError:
                    return None
            return (entry.value or b""), int(entry.revision or 0)

        return await self._healing(bucket, get)

    async def kv_put(self, bucket: str, key: str, value: bytes, *, last: int | None = None) -> int:
        """Write ``key``; ``last`` = None: unconditionally, 0: only if absent, n: only if at n.

        :raises KeyConflict: the condition failed.
        :raises StateUnavailable: the server did not answer.
        """

        async def put() -> int:
            kv = self._bucket(bucket)
            with _mapped(StateUnavailable, f"put {bucket}/{key}"):
                try:
                    if last is None:
                        return int(await kv.put(key, value))
                    if last == 0:
                        return int(await kv.create(key, value))
                    return int(await kv.update(key, value, last=last))
                except (
                    nats.js.errors.KeyWrongLastSequenceError,
                    nats.js.errors.KeyDeletedError,
                ) as e:
                    raise KeyConflict(f"{bucket}/{key}: {e}") from e

        return await self._healing(bucket, put)

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Delete ``key`` (a tombstone; a later get returns None)."""

        async def delete() -> None:
            with _mapped(StateUnavailable, f"delete {bucket}/{key}"):
                await self._bucket(bucket).delete(key)

        await self._healing(bucket, delete)

    async def kv_keys(self, bucket: str, prefix: str = ">") -> list[str]:
        """Live keys matching the filter (``a.b.>`` style); empty when none.

        Read as the last message per key (:meth:`kv_last_values`), not with nats-py's
        ``kv.keys()``: that stops its watcher only when everything succeeds, so a timeout or a
        cancellation left an ordered consumer subscribed and its heartbeat task running.
        """
        return [key for key, _ in await self.kv_last_values(bucket, prefix)]

    async def kv_last_values(self, bucket: str, prefix: str = ">") -> list[tuple[str, bytes]]:
        """``(key, value)`` of every live key matching the filter, in one request.

        One consumer on the bucket's stream delivering the last message per key, instead of
        :meth:`kv_keys` and a :meth:`kv_get` per key: a reader of thousands of keys costs one
        round trip. A deleted or purged key's last message is its tombstone and is skipped.

        :raises StateUnavailable: the bucket does not exist or does not answer.
        """
        subjects = f"$KV.{bucket}."

        async def last() -> list[Msg]:
            policy = api.DeliverPolicy.LAST_PER_SUBJECT
            return await self._pull(f"KV_{bucket}", subjects + prefix, policy)

        msgs = await self._healing(bucket, last)
        return [(m.subject.removeprefix(subjects), m.data) for m in msgs if not _tombstone(m)]

    async def _healing(self, bucket: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``; when it finds the bucket's stream gone, re-create the bucket, call again.

        Only for a bucket this connection ensured (:meth:`kv_ensure` remembered how).
        """
        try:
            return await call()
        except StateUnavailable as e:
            if bucket not in self._kv_config or not _stream_gone(e.__cause__):
                raise
        log.warning("bucket %s is gone from the server (its store was lost?): creating it", bucket)
        history, replicas = self._kv_config[bucket]
        await self.kv_ensure(bucket, history=history, replicas=replicas)
        return await call()

    def _bucket(self, bucket: str) -> Any:
        try:
            return self._kv[bucket]
        except KeyError:
            raise StateUnavailable(f"bucket {bucket} not opened (call kv_ensure)") from None

    async def _drain_pull(self, psub: Any) -> list[Msg]:
        info = await psub.consumer_info()
        remaining = int(info.num_pending)
        out: list[Msg] = []
        while remaining > 0:
            try:
                msgs = await psub.fetch(
                    batch=min(remaining, 256), timeout=self._settings.request_timeout_s
                )
            except nats.errors.TimeoutError:
                # What was pending may have expired meanwhile (max age): then all is read.
                if int((await psub.consumer_info()).num_pending) == 0:
                    break
                raise
            out.extend(msgs)
            remaining = int(msgs[-1].metadata.num_pending) if msgs else remaining
        return out


_STREAM_NOT_FOUND: Final = 10059


def _stream_gone(e: BaseException | None) -> bool:
    """The error of a request to a stream that does not exist (direct gets and publishes find
    no responder; API requests answer "stream not found")."""
    if isinstance(e, nats.errors.NoRespondersError | nats.js.errors.NoStreamResponseError):
        return True
    return isinstance(e, nats.js.errors.NotFoundError) and e.err_code == _STREAM_NOT_FOUND


def _tombstone(msg: Msg) -> bool:
    """A key-value delete or purge (the client's header), or a server-placed delete marker."""
    headers = msg.headers or {}
    return headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, a trailing ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


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

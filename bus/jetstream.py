"""JetStream through the NATS client: retention streams and key-value buckets, in bus terms.

One of the three modules that import ``nats`` (with :mod:`bus.connection` and
:mod:`bus.dialing`). A :class:`~bus.connection.Connection` holds one :class:`Streams`
(``conn.streams``) and one :class:`Buckets` (``conn.buckets``) over its client's JetStream
context; the typed APIs above them are :mod:`bus.state` and :mod:`bus.kv`.

A reconnect (a new client, :meth:`Streams.rebind`, :meth:`Buckets.rebind`) may reach a server
that lost its store (restarted empty): a bucket found gone is created again on the spot
(:meth:`Buckets.ensure` remembers how). Every ``nats`` exception is
mapped to a :mod:`bus.errors` type here, chained with ``from e``; callers see bytes only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from bus.dialing import mapped, quietly
from bus.errors import KeyConflict, StateUnavailable
from bus.settings import BusSettings

__all__ = ["Buckets", "RawMessage", "Streams"]

log = logging.getLogger(__name__)

T = TypeVar("T")
RawMessage = tuple[str, bytes]
"""A received message before decoding: ``(subject, payload)``."""


class Streams:
    """The connection's JetStream streams: ensured by their owner, read whole by anyone."""

    def __init__(self, js: JetStreamContext, settings: BusSettings) -> None:
        self._js = js
        self._settings = settings

    def rebind(self, js: JetStreamContext) -> None:
        """Go through ``js`` from now on: the connection's new client (see :mod:`bus.connection`)."""
        self._js = js

    async def ensure(
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
        with mapped(StateUnavailable, f"stream {name}"):
            try:
                await self._js.add_stream(config)
            except nats.js.errors.BadRequestError:
                # Exists with another configuration (an older release's limits, a changed max
                # age): update it in place; its messages stay.
                await self._js.update_stream(config)

    async def config(self, name: str) -> dict[str, Any]:
        """The stream's configuration as the server reports it (durations in seconds).

        :raises StateUnavailable: the stream does not exist or does not answer.
        """
        with mapped(StateUnavailable, f"stream {name}"):
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
        msgs = await _pull(self._js, self._settings, stream, filter_subject, policy)
        return [(m.subject, m.data) for m in msgs]


class Buckets:
    """The connection's key-value buckets (see :mod:`bus.kv` for the typed API and key layout).

    A bucket is opened (:meth:`ensure`) before any other operation on it; the others raise
    :class:`StateUnavailable` for a bucket never opened.
    """

    def __init__(self, js: JetStreamContext, settings: BusSettings) -> None:
        self._js = js
        self._settings = settings
        self._kv: dict[str, Any] = {}
        self._config: dict[str, tuple[int, int]] = {}

    def rebind(self, js: JetStreamContext) -> None:
        """Go through ``js`` from now on: the connection's new client (see :mod:`bus.connection`).

        The buckets opened stay open: a nats-py bucket handle is its name and subjects plus
        the JetStream context it sends through (its ``_js``, set here, in the one adapter).
        """
        self._js = js
        for kv in self._kv.values():
            kv._js = js

    async def ensure(
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
            self._config[bucket] = (history, replicas)
        with mapped(StateUnavailable, f"bucket {bucket}"):
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

    async def get(self, bucket: str, key: str) -> tuple[bytes, int] | None:
        """``(value, revision)`` of ``key``, or None when absent or deleted."""

        async def get() -> tuple[bytes, int] | None:
            with mapped(StateUnavailable, f"get {bucket}/{key}"):
                try:
                    entry = await self._bucket(bucket).get(key)
                except nats.js.errors.KeyNotFoundError:
                    return None
            return (entry.value or b""), int(entry.revision or 0)

        return await self._healing(bucket, get)

    async def put(self, bucket: str, key: str, value: bytes, *, last: int | None = None) -> int:
        """Write ``key``; ``last`` = None: unconditionally, 0: only if absent, n: only if at n.

        :raises KeyConflict: the condition failed.
        :raises StateUnavailable: the server did not answer.
        """

        async def put() -> int:
            kv = self._bucket(bucket)
            with mapped(StateUnavailable, f"put {bucket}/{key}"):
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

    async def delete(self, bucket: str, key: str) -> None:
        """Delete ``key`` (a tombstone; a later get returns None)."""

        async def delete() -> None:
            with mapped(StateUnavailable, f"delete {bucket}/{key}"):
                await self._bucket(bucket).delete(key)

        await self._healing(bucket, delete)

    async def keys(self, bucket: str, prefix: str = ">") -> list[str]:
        """Live keys matching the filter (``a.b.>`` style); empty when none.

        Read as the last message per key (:meth:`last_values`), not with nats-py's
        ``kv.keys()``: that stops its watcher only when everything succeeds, so a timeout or a
        cancellation left an ordered consumer subscribed and its heartbeat task running.
        """
        return [key for key, _ in await self.last_values(bucket, prefix)]

    async def last_values(self, bucket: str, prefix: str = ">") -> list[tuple[str, bytes]]:
        """``(key, value)`` of every live key matching the filter, in one request.

        One consumer on the bucket's stream delivering the last message per key, instead of
        :meth:`keys` and a :meth:`get` per key: a reader of thousands of keys costs one round
        trip. A deleted or purged key's last message is its tombstone and is skipped.

        :raises StateUnavailable: the bucket does not exist or does not answer.
        """
        subjects = f"$KV.{bucket}."

        async def last() -> list[Msg]:
            policy = api.DeliverPolicy.LAST_PER_SUBJECT
            return await _pull(self._js, self._settings, f"KV_{bucket}", subjects + prefix, policy)

        msgs = await self._healing(bucket, last)
        return [(m.subject.removeprefix(subjects), m.data) for m in msgs if not _tombstone(m)]

    async def _healing(self, bucket: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``; when it finds the bucket's stream gone, re-create the bucket, call again.

        Only for a bucket this connection ensured (:meth:`ensure` remembered how).
        """
        try:
            return await call()
        except StateUnavailable as e:
            if bucket not in self._config or not _stream_gone(e.__cause__):
                raise
        log.warning("bucket %s is gone from the server (its store was lost?): creating it", bucket)
        history, replicas = self._config[bucket]
        await self.ensure(bucket, history=history, replicas=replicas)
        return await call()

    def _bucket(self, bucket: str) -> Any:
        try:
            return self._kv[bucket]
        except KeyError:
            raise StateUnavailable(f"bucket {bucket} not opened (call ensure)") from None


async def _pull(
    js: JetStreamContext,
    settings: BusSettings,
    stream: str,
    filter_subject: str,
    policy: api.DeliverPolicy,
) -> list[Msg]:
    """Everything ``policy`` delivers from ``stream`` now, through a short-lived consumer."""
    config = api.ConsumerConfig(
        deliver_policy=policy,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=30.0,
        mem_storage=True,
    )
    with mapped(StateUnavailable, f"read {stream}"):
        # Shielded (bounded by the request timeout): a subscribe cancelled half-way would
        # leave its subscription behind with nobody to unsubscribe it.
        with anyio.CancelScope(shield=True):
            psub = await js.pull_subscribe(filter_subject, stream=stream, config=config)
        try:
            return await _drain_pull(psub, settings.request_timeout_s)
        finally:
            with anyio.CancelScope(shield=True):
                await quietly(psub.unsubscribe())


async def _drain_pull(psub: Any, timeout_s: float) -> list[Msg]:
    info = await psub.consumer_info()
    remaining = int(info.num_pending)
    out: list[Msg] = []
    while remaining > 0:
        try:
            msgs = await psub.fetch(batch=min(remaining, 256), timeout=timeout_s)
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

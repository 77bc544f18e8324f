"""The NATS transport: the only module that imports ``nats``.

:func:`connect` is an async context manager around one client connection. It retries the first
connection with capped exponential backoff and lets the client reconnect forever afterwards, so a
node agent started before the bus simply waits. Leaving the context drains the connection within
``settings.drain_timeout_s`` (shielded from cancellation), then closes it.

Every ``nats`` exception is mapped to a :mod:`bus.errors` type here, chained with ``from e``.
Callers see bytes and subjects only; events are the codec's business.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

import anyio
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from bus.errors import BusError, KeyConflict, NotConnected, PublishFailed, StateUnavailable
from bus.settings import BusSettings
from kit.redaction import redact_urls

__all__ = ["Connection", "RawMessage", "connect"]

log = logging.getLogger(__name__)

RawMessage = tuple[str, bytes]
"""A received message before decoding: ``(subject, payload)``."""

_MAX_CONNECT_BACKOFF_S: Final = 30.0
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

    def __init__(self, nc: Client, settings: BusSettings) -> None:
        self._nc = nc
        self._js = nc.jetstream(timeout=settings.request_timeout_s)
        self._settings = settings
        self._kv: dict[str, Any] = {}

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

    @asynccontextmanager
    async def subscribe(
        self, subject: str, on_message: Callable[[str, bytes], None]
    ) -> AsyncIterator[None]:
        """Call ``on_message(subject, payload)`` for every message on ``subject`` while inside.

        ``on_message`` runs on the client's reader path: it must not block and must not raise.
        """

        async def callback(msg: Msg) -> None:
            on_message(msg.subject, msg.data)

        with _mapped(BusError, f"subscribe {subject}"):
            sub = await self._nc.subscribe(subject, cb=callback)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                if not self._nc.is_closed:
                    await _quietly(sub.unsubscribe())

    @asynccontextmanager
    async def serve(
        self, subject: str, on_request: Callable[[bytes, str], None], *, queue: str
    ) -> AsyncIterator[None]:
        """Call ``on_request(payload, reply subject)`` for every request on ``subject`` while
        inside, sharing them with every other member of ``queue`` (one of them gets each).

        ``on_request`` runs on the client's reader path: it must not block and must not raise;
        answer with :meth:`publish` to the reply subject.
        """

        async def callback(msg: Msg) -> None:
            on_request(msg.data, msg.reply)

        with _mapped(BusError, f"serve {subject}"):
            sub = await self._nc.subscribe(subject, queue=queue, cb=callback)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                if not self._nc.is_closed:
                    await _quietly(sub.unsubscribe())

    async def ensure_stream(
        self,
        name: str,
        subjects: list[str],
        *,
        max_msgs_per_subject: int,
        max_age_s: float | None,
        replicas: int,
    ) -> None:
        """Create the stream, or bring an existing one to this configuration (idempotent).

        :raises StateUnavailable: JetStream is disabled, or the request failed or timed out.
        """
        config = api.StreamConfig(
            name=name,
            subjects=subjects,
            storage=api.StorageType.FILE,
            max_msgs_per_subject=max_msgs_per_subject,
            max_age=max_age_s,
            num_replicas=replicas,
            allow_direct=True,
            deny_delete=True,
        )
        with _mapped(StateUnavailable, f"stream {name}"):
            try:
                await self._js.add_stream(config)
            except nats.js.errors.BadRequestError:
                # Exists with another configuration (e.g. a changed max age): update it in place.
                await self._js.update_stream(config)

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
            psub = await self._js.pull_subscribe(filter_subject, stream=stream, config=config)
            try:
                return await self._drain_pull(psub)
            finally:
                with anyio.CancelScope(shield=True):
                    await _quietly(psub.unsubscribe())

    # --- JetStream key-value buckets (see bus.kv for the typed API and key layout) -------------

    async def kv_ensure(
        self, bucket: str, *, history: int = 1, replicas: int = 1, create: bool = True
    ) -> None:
        """Create the key-value bucket, or bind to it when it exists (idempotent).

        :param create: False only binds: for readers that may not create buckets (the agents).
        :raises StateUnavailable: JetStream is disabled, the request failed, or the bucket does
            not exist and ``create`` is false.
        """
        with _mapped(StateUnavailable, f"bucket {bucket}"):
            try:
                kv = await self._js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                if not create:
                    raise StateUnavailable(f"bucket {bucket} does not exist (yet)") from None
                # Direct gets name the key in the request subject, so the server can restrict
                # which keys a reader may get (an agent: its own node's).
                kv = await self._js.create_key_value(
                    bucket=bucket, history=history, replicas=replicas, direct=True
                )
            if create and not kv._direct:  # a bucket of an older version: turn direct gets on
                info = await self._js.stream_info(f"KV_{bucket}")
                await self._js.update_stream(info.config.evolve(allow_direct=True))
                kv = await self._js.key_value(bucket)
            self._kv[bucket] = kv

    async def kv_get(self, bucket: str, key: str) -> tuple[bytes, int] | None:
        """``(value, revision)`` of ``key``, or None when absent or deleted."""
        kv = self._bucket(bucket)
        with _mapped(StateUnavailable, f"get {bucket}/{key}"):
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return None
        return (entry.value or b""), int(entry.revision or 0)

    async def kv_put(self, bucket: str, key: str, value: bytes, *, last: int | None = None) -> int:
        """Write ``key``; ``last`` = None: unconditionally, 0: only if absent, n: only if at n.

        :raises KeyConflict: the condition failed.
        :raises StateUnavailable: the server did not answer.
        """
        kv = self._bucket(bucket)
        with _mapped(StateUnavailable, f"put {bucket}/{key}"):
            try:
                if last is None:
                    return int(await kv.put(key, value))
                if last == 0:
                    return int(await kv.create(key, value))
                return int(await kv.update(key, value, last=last))
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyDeletedError) as e:
                raise KeyConflict(f"{bucket}/{key}: {e}") from e

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Delete ``key`` (a tombstone; a later get returns None)."""
        kv = self._bucket(bucket)
        with _mapped(StateUnavailable, f"delete {bucket}/{key}"):
            await kv.delete(key)

    async def kv_keys(self, bucket: str, prefix: str = ">") -> list[str]:
        """Live keys matching the filter (``a.b.>`` style); empty when none."""
        kv = self._bucket(bucket)
        with _mapped(StateUnavailable, f"keys {bucket}"):
            try:
                # Not ``filters=``: nats-py 2.16 answers NoKeysError for any filter.
                keys = list(await kv.keys())
            except nats.js.errors.NoKeysError:
                return []
        return [k for k in keys if subject_matches(prefix, k)]

    async def kv_last_values(self, bucket: str, prefix: str = ">") -> list[tuple[str, bytes]]:
        """``(key, value)`` of every live key matching the filter, in one request.

        One consumer on the bucket's stream delivering the last message per key, instead of
        :meth:`kv_keys` and a :meth:`kv_get` per key: a reader of thousands of keys costs one
        round trip. A deleted or purged key's last message is its tombstone and is skipped.

        :raises StateUnavailable: the bucket does not exist or does not answer.
        """
        subjects = f"$KV.{bucket}."
        msgs = await self._pull(
            f"KV_{bucket}", subjects + prefix, api.DeliverPolicy.LAST_PER_SUBJECT
        )
        return [(m.subject.removeprefix(subjects), m.data) for m in msgs if not _tombstone(m)]

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
            msgs = await psub.fetch(
                batch=min(remaining, 256), timeout=self._settings.request_timeout_s
            )
            out.extend(msgs)
            remaining = int(msgs[-1].metadata.num_pending) if msgs else remaining
        return out


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


async def _quietly(aw: Awaitable[object]) -> None:
    try:
        await aw
    except (nats.errors.Error, OSError) as e:
        log.debug("ignored during cleanup: %r", e)


def _tls_context(settings: BusSettings) -> ssl.SSLContext | None:
    if not (settings.tls_ca_file or settings.tls_cert_file):
        return None
    ctx = ssl.create_default_context(cafile=settings.tls_ca_file)
    if settings.tls_cert_file:
        ctx.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return ctx


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
    settings: BusSettings, name: str | None, errors: list[Exception] | None = None
) -> dict[str, Any]:
    async def on_error(e: Exception) -> None:
        if errors is not None:
            errors.append(e)
        log.warning("bus connection error: %r", e)

    async def on_disconnected() -> None:
        log.info("bus disconnected")

    async def on_reconnected() -> None:
        log.info("bus reconnected")

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
        "tls": _tls_context(settings),
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


async def _open(settings: BusSettings, name: str | None, retry: bool) -> Client:
    attempt = 0
    shown = redact_urls(settings.url)  # warned on every round: never with its password
    while True:
        nc = Client()
        # nats-py can wait forever on a failed TLS handshake: bound each round ourselves.
        bound = settings.connect_timeout_s * (2 * len(settings.servers) + 1)
        seen: list[Exception] = []
        try:
            with anyio.fail_after(bound):
                await nc.connect(**_options(settings, name, seen))
        except (nats.errors.Error, OSError, TimeoutError) as e:
            with anyio.CancelScope(shield=True):
                await _quietly(nc.close())
            if not retry:
                cause = seen[-1] if seen else e  # the client's own error says more than a timeout
                raise NotConnected(f"cannot connect to {shown}: {cause!r}") from e
            delay = min(settings.reconnect_wait_s * 2**attempt, _MAX_CONNECT_BACKOFF_S)
            log.warning("cannot connect to %s (%r); retrying in %.1fs", shown, e, delay)
            attempt += 1
            await anyio.sleep(delay)
        except BaseException:  # cancelled mid-connect: close the half-open client, then go
            with anyio.CancelScope(shield=True):
                await _quietly(nc.close())
            raise
        else:
            # nats-py has no separate setting for the first connection, and with -1 it would
            # spin inside connect() forever: switch to "reconnect forever" only now.
            nc.options["max_reconnect_attempts"] = -1
            return nc


@asynccontextmanager
async def connect(
    settings: BusSettings, *, name: str | None = None, retry: bool = True
) -> AsyncIterator[Connection]:
    """Connect to the bus; drain and close on exit.

    :param name: the client name shown by the server's monitoring (e.g. ``agent/<node>``).
    :param retry: retry the first connection forever (agents) or fail at once (CLI tools).
    :raises NotConnected: only when ``retry`` is false and no server answered.
    """
    nc = await _open(settings, name, retry)
    try:
        yield Connection(nc, settings)
    finally:
        with anyio.move_on_after(settings.drain_timeout_s, shield=True):
            if nc.is_connected:
                await _quietly(nc.drain())
        with anyio.CancelScope(shield=True):
            if not nc.is_closed:
                await _quietly(nc.close())

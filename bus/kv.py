"""JetStream key-value buckets the control plane writes and the agents read.

Two buckets, both history 1 (last value per key), created idempotently by :func:`open_bucket`:

``GPUSTACK_V1_LEDGER``
    The control plane's ledger when there is no Kubernetes API (``standalone``): one key per
    object, ``<plural>.<namespace or _>.<name>``, the value the object's JSON as the API would
    hold it (``metadata.resourceVersion`` = the KV revision).
``GPUSTACK_V1_AGENTS``
    What agents need and must not fetch from Kubernetes themselves:

    - ``nms.<node>``: that node's ``NodeModelStore`` spec;
    - ``artifacts.<namespace>.<name>``: a ``ModelArtifact`` a Pod in ``namespace`` may mount;
    - ``pending.<node>``: the containers bound to that node that wait for a sliced or
      partitioned device (what the device agent's Allocate cannot learn from kubelet alone).

    The values are the records of :mod:`bus.records`, the one definition both sides encode and
    decode; this module holds only buckets, keys and their escaping.

Keys may only hold ``A-Z a-z 0-9 _ -`` per token here: every other character of a name
(``.`` in node names, ``=`` itself) becomes ``=XX`` (uppercase hex of each UTF-8 byte), which is
reversible and canonical (:func:`escape` / :func:`unescape`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import msgspec

from bus.connection import Connection
from bus.errors import BusError, KeyConflict

__all__ = [
    "AGENTS_BUCKET",
    "LEDGER_BUCKET",
    "Bucket",
    "Observer",
    "artifact_key",
    "escape",
    "nms_key",
    "open_bucket",
    "pending_key",
    "stream_of",
    "subject_of",
    "unescape",
]

LEDGER_BUCKET: Final = "GPUSTACK_V1_LEDGER"
AGENTS_BUCKET: Final = "GPUSTACK_V1_AGENTS"
T = TypeVar("T")
_PLAIN = re.compile(r"[A-Za-z0-9_-]")
_ESCAPED = re.compile(r"=([0-9A-F]{2})")


def escape(name: str) -> str:
    """``name`` as one key token (never empty: ``""`` becomes ``=``-free ``_``-free ``=00``)."""
    if not name:
        return "=00"
    return "".join(
        ch if _PLAIN.fullmatch(ch) else "".join(f"={b:02X}" for b in ch.encode("utf-8"))
        for ch in name
    )


def unescape(token: str) -> str:
    """Invert :func:`escape`."""
    if token == "=00":
        return ""
    raw = bytearray()
    pos = 0
    for m in _ESCAPED.finditer(token):
        raw += token[pos : m.start()].encode("ascii")
        raw.append(int(m.group(1), 16))
        pos = m.end()
    raw += token[pos:].encode("ascii")
    return raw.decode("utf-8")


def stream_of(bucket: str) -> str:
    """The JetStream stream holding ``bucket`` (what permissions and stream requests name)."""
    return f"KV_{bucket}"


def subject_of(bucket: str, key: str) -> str:
    """The subject ``key`` of ``bucket`` is stored under (``key`` may be a wildcard filter)."""
    return f"$KV.{bucket}.{key}"


def nms_key(node: str) -> str:
    return f"nms.{escape(node)}"


def pending_key(node: str) -> str:
    return f"pending.{escape(node)}"


def artifact_key(namespace: str, name: str) -> str:
    return f"artifacts.{escape(namespace)}.{escape(name)}"


Observer = Callable[[str, str], None]
"""Called with ``(verb, result)`` after every bucket operation: verbs ``kv_get``, ``kv_put``,
``kv_delete``, ``kv_keys``, ``kv_last``; results ``ok``, ``conflict`` (a failed ``last``
precondition) or ``error``."""


def _ignore(verb: str, result: str) -> None:
    pass


class Bucket:
    """One key-value bucket: bytes values with revisions; see :class:`~bus.jetstream.Buckets` for errors."""

    def __init__(self, conn: Connection, name: str, *, observe: Observer = _ignore) -> None:
        self._conn = conn
        self.name = name
        self._observe = observe

    async def get(self, key: str) -> tuple[bytes, int] | None:
        return await self._counted("kv_get", self._conn.buckets.get(self.name, key))

    async def put(self, key: str, value: bytes, *, last: int | None = None) -> int:
        """:raises bus.errors.KeyConflict: ``last`` given and not the current revision."""
        return await self._counted(
            "kv_put", self._conn.buckets.put(self.name, key, value, last=last)
        )

    async def delete(self, key: str) -> None:
        await self._counted("kv_delete", self._conn.buckets.delete(self.name, key))

    async def keys(self, prefix: str = ">") -> list[str]:
        return await self._counted("kv_keys", self._conn.buckets.keys(self.name, prefix))

    async def last_values(self, prefix: str = ">") -> list[tuple[str, bytes]]:
        """``(key, value)`` of every live key matching ``prefix`` (``a.b.>`` style), deleted
        keys skipped: one request however many keys, for readers that want the whole bucket."""
        return await self._counted("kv_last", self._conn.buckets.last_values(self.name, prefix))

    async def put_record(self, key: str, record: msgspec.Struct) -> int:
        """Write one of the :mod:`bus.records` records as its JSON."""
        return await self.put(key, msgspec.json.encode(record))

    async def _counted(self, verb: str, operation: Awaitable[T]) -> T:
        try:
            result = await operation
        except KeyConflict:
            self._observe(verb, "conflict")
            raise
        except BusError:
            self._observe(verb, "error")
            raise
        self._observe(verb, "ok")
        return result


async def open_bucket(
    conn: Connection,
    name: str,
    *,
    replicas: int = 1,
    observe: Observer = _ignore,
    create: bool = True,
) -> Bucket:
    """Create or bind ``name`` (history 1); ``observe`` counts every later operation.

    :param create: False only binds: agents read buckets the worker creates, and may not
        create them (:mod:`bus.identity`).
    :raises bus.errors.StateUnavailable: JetStream is off or not answering, or the bucket does
        not exist and ``create`` is false.
    """
    await conn.buckets.ensure(name, history=1, replicas=replicas, create=create)
    return Bucket(conn, name, observe=observe)

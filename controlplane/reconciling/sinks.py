"""Where reconcilers write: the :class:`Sink` seam and its two implementations.

- :class:`KubeSink`: the Kubernetes API through :class:`controlplane.k8s.client.KubeClient`.
- :class:`KvSink`: the bus's JetStream key-value ledger (``standalone``, no cluster). Objects are
  stored whole under ``<plural>.<namespace or _>.<name>``; the KV revision is the
  ``resourceVersion``, so preconditions, conflicts and the reconcile code are the same. Patches are
  RFC 7386 merges applied here; the ``status`` subresource changes only ``status``, the main
  resource never does, as on the API server. Unlike the API server, a create keeps ``status``
  (``creates_with_status``): one write per new object.

``has_nodes`` says whether Node objects exist: without them every node counts as present, no
owner references are set and no node labels or capacity are written.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from typing import Any, Protocol

import msgspec

from bus import kv
from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.resources import Observed, Ref, Resource

__all__ = ["KubeSink", "KvSink", "Sink", "merge"]


class Sink(Protocol):
    """The object store reconcilers read and write. Errors: :mod:`controlplane.errors`."""

    has_nodes: bool
    creates_with_status: bool
    """True: a create stores ``status`` too (no separate status patch is needed)."""

    async def get(self, ref: Ref) -> Observed | None:
        """The object, or None when absent."""
        ...

    async def list(self, resource: Resource) -> list[Observed]: ...

    async def create(self, ref: Ref, body: dict[str, Any]) -> Observed:
        """:raises Conflict: it exists."""
        ...

    async def patch(
        self, ref: Ref, body: dict[str, Any], *, subresource: str | None = None
    ) -> Observed:
        """Merge patch; ``metadata.resourceVersion`` in ``body`` is a precondition.

        :raises Conflict: stale precondition. :raises NotFound: absent.
        """
        ...

    async def delete(self, ref: Ref) -> None:
        """Delete; absent is not an error."""
        ...


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (pure; ``target`` is not modified)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


class KubeSink:
    """The Kubernetes API."""

    has_nodes = True
    creates_with_status = False

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def get(self, ref: Ref) -> Observed | None:
        try:
            return Observed.of(await self._client.get(ref))
        except errors.NotFound:
            return None

    async def list(self, resource: Resource) -> list[Observed]:
        return [Observed.of(o) for o in await self._client.list(resource)]

    async def create(self, ref: Ref, body: dict[str, Any]) -> Observed:
        return Observed.of(await self._client.create(ref, body))

    async def patch(
        self, ref: Ref, body: dict[str, Any], *, subresource: str | None = None
    ) -> Observed:
        return Observed.of(await self._client.patch(ref, body, subresource=subresource))

    async def delete(self, ref: Ref) -> None:
        try:
            await self._client.delete(ref)
        except errors.NotFound:
            pass


def ledger_key(ref: Ref) -> str:
    return f"{ref.resource.plural}.{kv.escape(ref.namespace or '_')}.{kv.escape(ref.name)}"


class KvSink:
    """The bus's key-value ledger (see the module docstring).

    Hot path: every object this sink read or wrote is remembered (body and revision, at most
    ``max_cached`` keys, least recently used dropped first), so a patch is one conditional put
    (``last=<revision>``) with no get before it, and a create one put with ``last=0``. The
    cache is only ever a guess: the KV revision check is the truth. Invariants:

    - a put whose ``last`` is stale (someone else wrote the key) fails, the key is dropped from
      the cache, and the caller gets :class:`~controlplane.errors.Conflict` exactly as from a
      stale ``resourceVersion``; its next :meth:`get` reads the bucket;
    - a patch without a precondition re-reads once on such a conflict and retries, so it is
      never refused because of this cache;
    - an empty cache (a restarted worker) only costs one get per key;
    - a write whose bytes hash to what this sink last wrote at the cached revision is not sent
      (write only on change holds here too, whatever the caller planned).

    ``creates_with_status``: a create keeps ``status`` (a ledger has no status subresource to
    protect), so a new object is one write instead of a create and a status patch.
    """

    has_nodes = False
    creates_with_status = True

    def __init__(self, bucket: kv.Bucket, *, max_cached: int = 100_000) -> None:
        self._bucket = bucket
        self._cache: OrderedDict[str, Observed] = OrderedDict()
        self._digests: dict[str, bytes] = {}
        """Hash of the bytes this sink last wrote per key (at the cached revision)."""
        self._max_cached = max_cached

    async def get(self, ref: Ref) -> Observed | None:
        key = ledger_key(ref)
        found = await self._call(self._bucket.get(key))
        if found is None:
            self._forget(key)
            return None
        value, revision = found
        return self._remember(key, _observed(msgspec.json.decode(value), revision))

    async def list(self, resource: Resource) -> list[Observed]:
        out: list[Observed] = []
        for key in await self._call(self._bucket.keys(f"{resource.plural}.>")):
            found = await self._call(self._bucket.get(key))
            if found is not None:
                obj = _observed(msgspec.json.decode(found[0]), found[1])
                out.append(self._remember(key, obj))
        return out

    async def create(self, ref: Ref, body: dict[str, Any]) -> Observed:
        return await self._write(ref, body, last=0)

    async def patch(
        self, ref: Ref, body: dict[str, Any], *, subresource: str | None = None
    ) -> Observed:
        want = (body.get("metadata") or {}).get("resourceVersion")
        for attempt in range(2):
            current = self._cache.get(ledger_key(ref)) or await self.get(ref)
            if current is None:
                raise errors.NotFound(404, f"{ref} not found")
            if want is not None and want != current.resource_version:
                self._forget(ledger_key(ref))
                raise errors.Conflict(409, f"{ref}: resourceVersion {want} is stale")
            try:
                return await self._write(
                    ref, _patched(current.body, body, subresource),
                    last=int(current.resource_version),
                )  # fmt: skip
            except errors.Conflict:
                if want is not None or attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def delete(self, ref: Ref) -> None:
        key = ledger_key(ref)
        self._forget(key)
        await self._call(self._bucket.delete(key))

    async def _write(self, ref: Ref, body: dict[str, Any], *, last: int) -> Observed:
        key = ledger_key(ref)
        meta = body.get("metadata") or {}
        if "resourceVersion" in meta:
            body = {**body, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
        data = msgspec.json.encode(body)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        cached = self._cache.get(key)
        unchanged = self._digests.get(key) == digest
        if cached is not None and last == int(cached.resource_version) and unchanged:
            return cached  # byte-identical to what is stored at that revision: no write
        try:
            revision = await self._call(self._bucket.put(key, data, last=last))
        except BaseException:
            self._forget(key)  # unknown outcome: the bucket is the truth
            raise
        written = self._remember(key, _observed(msgspec.json.decode(data), revision))
        self._digests[key] = digest
        return written

    def forget(self) -> None:
        """Drop the whole cache: the bucket may have lost what it held (a store lost)."""
        self._cache.clear()
        self._digests.clear()

    def _forget(self, key: str) -> None:
        self._cache.pop(key, None)
        self._digests.pop(key, None)

    def _remember(self, key: str, obj: Observed) -> Observed:
        if self._cache.get(key) is not obj:
            self._digests.pop(key, None)  # only what this sink wrote has a known digest
        self._cache[key] = obj
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_cached:
            self._digests.pop(self._cache.popitem(last=False)[0], None)
        return obj

    async def _call(self, aw: Any) -> Any:
        with errors.mapped_bus_errors(self._bucket.name):
            return await aw


def _patched(current: dict[str, Any], body: dict[str, Any], subresource: str | None) -> Any:
    """``current`` with the merge patch applied as the API server would (pure)."""
    if subresource == "status":
        return dict(current, status=_merge_shared(current.get("status"), body.get("status")))
    return _merge_shared(current, {k: v for k, v in body.items() if k != "status"})


def _merge_shared(target: Any, patch: Any) -> Any:
    """:func:`merge` without copying leaves: the result shares them with ``target`` and
    ``patch``, so it may only be encoded, never kept or modified."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_shared(out.get(k), v)
    return out


def _observed(body: dict[str, Any], revision: int) -> Observed:
    body.setdefault("metadata", {})["resourceVersion"] = str(revision)
    return Observed(body=body, resource_version=str(revision))

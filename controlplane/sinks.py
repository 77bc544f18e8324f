"""Where reconcilers write: the :class:`Sink` seam and its two implementations.

- :class:`KubeSink`: the Kubernetes API through :class:`controlplane.k8s.client.KubeClient`.
- :class:`KvSink`: the bus's JetStream key-value ledger (``standalone``, no cluster). Objects are
  stored whole under ``<plural>.<namespace or _>.<name>``; the KV revision is the
  ``resourceVersion``, so preconditions, conflicts and the reconcile code are the same. Patches are
  RFC 7386 merges applied here; the ``status`` subresource changes only ``status``, the main
  resource never does, as on the API server.

``has_nodes`` says whether Node objects exist: without them every node counts as present, no
owner references are set and no node labels or capacity are written.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import msgspec

from bus import errors as bus_errors
from bus import kv
from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.resources import Observed, Ref, Resource

__all__ = ["KubeSink", "KvSink", "Sink", "merge"]


class Sink(Protocol):
    """The object store reconcilers read and write. Errors: :mod:`controlplane.errors`."""

    has_nodes: bool

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
    """The bus's key-value ledger (see the module docstring)."""

    has_nodes = False

    def __init__(self, bucket: kv.Bucket) -> None:
        self._bucket = bucket

    async def get(self, ref: Ref) -> Observed | None:
        found = await self._call(self._bucket.get(ledger_key(ref)))
        if found is None:
            return None
        value, revision = found
        return _observed(msgspec.json.decode(value), revision)

    async def list(self, resource: Resource) -> list[Observed]:
        out: list[Observed] = []
        for key in await self._call(self._bucket.keys(f"{resource.plural}.>")):
            found = await self._call(self._bucket.get(key))
            if found is not None:
                out.append(_observed(msgspec.json.decode(found[0]), found[1]))
        return out

    async def create(self, ref: Ref, body: dict[str, Any]) -> Observed:
        body = {k: v for k, v in body.items() if k != "status"}
        return await self._write(ref, body, last=0)

    async def patch(
        self, ref: Ref, body: dict[str, Any], *, subresource: str | None = None
    ) -> Observed:
        current = await self.get(ref)
        if current is None:
            raise errors.NotFound(404, f"{ref} not found")
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != current.resource_version:
            raise errors.Conflict(409, f"{ref}: resourceVersion {want} is stale")
        if subresource == "status":
            new = dict(current.body, status=merge(current.body.get("status"), body.get("status")))
        else:
            new = merge(current.body, {k: v for k, v in body.items() if k != "status"})
        return await self._write(ref, new, last=int(current.resource_version))

    async def delete(self, ref: Ref) -> None:
        await self._call(self._bucket.delete(ledger_key(ref)))

    async def _write(self, ref: Ref, body: dict[str, Any], *, last: int) -> Observed:
        body = copy.deepcopy(body)
        body.setdefault("metadata", {}).pop("resourceVersion", None)
        revision = await self._call(
            self._bucket.put(ledger_key(ref), msgspec.json.encode(body), last=last)
        )
        return _observed(body, revision)

    async def _call(self, aw: Any) -> Any:
        try:
            return await aw
        except bus_errors.KeyConflict as e:
            raise errors.Conflict(409, str(e)) from e
        except bus_errors.BusError as e:
            raise errors.ServerError(0, str(e)) from e


def _observed(body: dict[str, Any], revision: int) -> Observed:
    body.setdefault("metadata", {})["resourceVersion"] = str(revision)
    return Observed(body=body, resource_version=str(revision))

"""Where the settings live, and the one frozen :class:`~controlplane.clustersettings.catalog.Values`
everyone reads.

Two backends behind :class:`Backend`: the Secret ``gpustack-settings`` in the system namespace
(one data key per setting), or, under ``--kubeconfig=none``, one key of the bus's ledger bucket
holding the same map as JSON. :class:`SettingsSource`:

- :meth:`~SettingsSource.prepare` (every replica, at start): creates the store from the seed when
  absent, else adds only the settings it lacks (backfill: an existing text is never overwritten);
- :meth:`~SettingsSource.refresh` re-reads it and swaps :attr:`~SettingsSource.values` when the
  stored texts changed; :meth:`~SettingsSource.run` does so every ``period_s`` (10 s by default,
  so a change reaches reconcilers and webhooks within the 30 s the contract allows, API watches
  included);
- :meth:`~SettingsSource.write` validates and stores one text, conditionally on the version it
  read (a concurrent edit is a :class:`~controlplane.errors.Conflict`, never lost silently).

Invariant: :attr:`values` is replaced, never mutated; readers take it once per decision.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from bus import kv
from bus.errors import BusError, KeyConflict
from controlplane import errors
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.clustersettings.catalog import SECRET_NAME, Values
from controlplane.k8s.client import KubeClient
from controlplane.resources import SECRETS, Ref

__all__ = ["Backend", "KvBackend", "SecretBackend", "SettingsSource", "Stored"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stored:
    """The stored texts and the version to write conditionally against."""

    data: dict[str, str]
    version: str
    created: str = ""
    """When the store was created (RFC 3339), for the API's ``creationTimestamp``."""


class Backend(Protocol):
    async def load(self) -> Stored | None:
        """None: no store yet."""
        ...

    async def create(self, data: Mapping[str, str]) -> Stored:
        """:raises errors.Conflict: someone created it first."""
        ...

    async def update(self, data: Mapping[str, str], version: str) -> Stored:
        """Set these keys (others kept). :raises errors.Conflict: ``version`` is stale."""
        ...


class SecretBackend:
    """The Secret ``gpustack-settings`` (type Opaque) in ``namespace``."""

    def __init__(self, api: KubeClient, namespace: str) -> None:
        self._api = api
        self._ref = Ref(resource=SECRETS, name=SECRET_NAME, namespace=namespace)

    @staticmethod
    def _stored(body: dict[str, object]) -> Stored:
        meta = body.get("metadata") or {}
        assert isinstance(meta, dict)
        raw = body.get("data") or {}
        assert isinstance(raw, dict)
        data = {}
        for key, value in raw.items():
            try:
                data[str(key)] = base64.b64decode(str(value)).decode()
            except (ValueError, UnicodeDecodeError):
                log.warning("setting %s is not base64 UTF-8 text; ignored", key)
        return Stored(
            data, str(meta.get("resourceVersion", "")), str(meta.get("creationTimestamp", ""))
        )

    async def load(self) -> Stored | None:
        try:
            return self._stored(await self._api.get(self._ref))
        except errors.NotFound:
            return None

    async def create(self, data: Mapping[str, str]) -> Stored:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": SECRET_NAME,
                "namespace": self._ref.namespace,
                "labels": {"app.kubernetes.io/part-of": "gpustack-operator"},
            },
            "data": _encoded(data),
        }
        return self._stored(await self._api.create(self._ref, body))

    async def update(self, data: Mapping[str, str], version: str) -> Stored:
        body = {"metadata": {"resourceVersion": version}, "data": _encoded(data)}
        return self._stored(await self._api.patch(self._ref, body))


def _encoded(data: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}


class KvBackend:
    """One key of the ledger bucket (``settings.<namespace>.gpustack-settings``), a JSON map."""

    def __init__(self, bucket: kv.Bucket, namespace: str) -> None:
        self._bucket = bucket
        self._key = f"settings.{kv.escape(namespace)}.{SECRET_NAME}"

    async def load(self) -> Stored | None:
        with errors.mapped_bus_errors("read the settings"):
            found = await self._bucket.get(self._key)
        if found is None:
            return None
        data = msgspec.json.decode(found[0], type=dict[str, str])
        return Stored(data, str(found[1]))

    async def _put(self, data: Mapping[str, str], last: int) -> Stored:
        try:
            revision = await self._bucket.put(self._key, msgspec.json.encode(data), last=last)
        except KeyConflict as e:
            raise errors.Conflict(409, "the settings changed meanwhile") from e
        except BusError as e:
            raise errors.SinkUnavailable(f"cannot write the settings: {e}") from e
        return Stored(dict(data), str(revision))

    async def create(self, data: Mapping[str, str]) -> Stored:
        return await self._put(data, 0)

    async def update(self, data: Mapping[str, str], version: str) -> Stored:
        current = await self.load()
        merged = {**(current.data if current else {}), **data}
        return await self._put(merged, int(version))


Listener = Callable[[Values, Stored], None]


class SettingsSource:
    """The current settings of the cluster, kept fresh from a :class:`Backend`."""

    def __init__(self, backend: Backend, seed: Mapping[str, str], *, period_s: float = 10.0):
        self._backend = backend
        self._seed = dict(seed)
        self.period_s = period_s
        self.values: Values = settingscatalog.parse(self._seed)[0]
        self.stored: Stored = Stored(dict(self._seed), "")
        self._watchers: set[MemoryObjectSendStream[Stored]] = set()

    async def prepare(self) -> None:
        """Create the store from the seed, or backfill the settings it lacks (never overwrite);
        conflict-tolerant, as every replica runs it."""
        for _ in range(5):
            stored = await self._backend.load()
            try:
                if stored is None:
                    stored = await self._backend.create(self._seed)
                    log.info("settings created from the seed (%d settings)", len(self._seed))
                else:
                    missing = settingscatalog.backfill(stored.data, self._seed)
                    if missing:
                        stored = await self._backend.update(missing, stored.version)
                        log.info("settings backfilled: %s", ", ".join(sorted(missing)))
            except errors.Conflict:
                continue
            self._swap(stored)
            return
        raise errors.Conflict(409, "the settings kept changing while being prepared")

    async def refresh(self) -> bool:
        """Read the store again; True when the values changed."""
        stored = await self._backend.load()
        if stored is None:  # deleted by hand: recreate from the seed, as on first start
            await self.prepare()
            return True
        if stored.data == self.stored.data:
            self.stored = stored
            return False
        self._swap(stored)
        return True

    async def run(self) -> None:
        """Refresh every ``period_s`` until cancelled (errors are logged, the old values kept)."""
        while True:
            await anyio.sleep(self.period_s)
            try:
                await self.refresh()
            except (errors.ApiError, BusError) as e:
                log.warning("re-reading the settings failed (keeping the last ones): %s", e)

    async def write(self, name: str, text: str) -> Stored:
        """Validate and store one setting against the version last read.

        :raises settingscatalog.InvalidSetting: bad name or text, or not editable.
        :raises errors.Conflict: the store changed since it was read.
        """
        entry = settingscatalog.BY_NAME.get(name)
        if entry is None:
            raise settingscatalog.InvalidSetting(f"no setting {name!r} (the catalog is fixed)")
        if not entry.editable:
            raise settingscatalog.InvalidSetting(f"setting {name} is not editable")
        settingscatalog.validate_all({**self.stored.data, name: text})
        stored = await self._backend.update({name: text}, self.stored.version)
        self._swap(stored)
        return stored

    def _swap(self, stored: Stored) -> None:
        values, problems = settingscatalog.parse(stored.data)
        for problem in problems:
            log.warning("%s", problem)
        changed = stored.data != self.stored.data
        self.values, self.stored = values, stored
        if changed:
            for send in list(self._watchers):
                try:
                    send.send_nowait(stored)
                except anyio.WouldBlock:  # a slow watcher loses intermediate states only
                    pass
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self._watchers.discard(send)

    @asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[Stored]]:
        """Every later change while inside (bounded: a slow reader skips to newer states)."""
        send, receive = anyio.create_memory_object_stream[Stored](16)
        self._watchers.add(send)
        try:
            yield receive
        finally:
            self._watchers.discard(send)
            send.close()
            receive.close()

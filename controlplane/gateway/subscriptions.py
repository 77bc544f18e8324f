"""Subscribed clusters: each one's readiness loop, its kept kinds, and reads across them.

:meth:`Manager.subscribe` claims a cluster (a repeat is a no-op unless ``force``, which drops the
old subscription first; the token is not updated by a repeat) and starts its loop:

1. **readiness**: every ``readiness_poll_s`` (2 s, or the timeout if shorter) read both
   APIServices, up to ``readiness_timeout_s``; on failure pause 5 s, doubling to 60 s, and check again, forever,
   until unsubscribed. The first failure is logged as a warning, later ones at debug: a
   GPUStack server answering 503 "No reachable workers" is a normal, transient state;
2. **kept kinds**: once ready, every subscribed kind is listed (``limit=500&resourceVersion=0``)
   and watched from the list's version; a 410 lists again; any other failure pauses and lists
   again, the cache kept meanwhile; a kind the cluster does not serve (404) is held empty and
   looked for again later. Every change is published to the :class:`~.hub.Hub`.

:meth:`Manager.unsubscribe` cancels the loop (pending or ready) and publishes ``DELETED`` with
no object. :meth:`Manager.read` answers a kind for some clusters: from the cache of a kept kind
once it listed, else by a live list; a cluster that is not ready, or whose list fails, is
skipped and the others are answered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from controlplane import errors
from controlplane.gateway import kinds
from controlplane.gateway.hub import Event, Hub
from controlplane.gateway.kinds import Kind
from controlplane.gateway.settings import GatewaySettings
from controlplane.gateway.upstream import WATCH_SECONDS, ClusterApi

__all__ = ["Manager"]

log = logging.getLogger(__name__)

ABSENT_RETRY_S = 60.0
Key = tuple[str, str]


class NotReady(Exception):
    pass


@dataclass
class _Cluster:
    id: str
    api: ClusterApi
    kept: frozenset[Kind]
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    ready: bool = False
    reason: str = "pending"
    caches: dict[str, dict[Key, dict[str, Any]]] = field(default_factory=dict)
    synced: set[str] = field(default_factory=set)


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Manager:
    def __init__(
        self,
        settings: GatewaySettings,
        connect: Callable[[str, str], ClusterApi],
        hub: Hub,
        tg: TaskGroup,
    ) -> None:
        self._settings = settings
        self._connect = connect
        self._hub = hub
        self._tg = tg
        self.clusters: dict[str, _Cluster] = {}

    def subscribe(self, cluster: str, token: str, gvks: Iterable[tuple[str, str, str]],
                  *, force: bool = False) -> bool:  # fmt: skip
        """Start keeping ``cluster``; False when it already was (and ``force`` not given)."""
        if force:
            self.unsubscribe(cluster)
        if cluster in self.clusters:
            return False
        kept = set()
        for gvk in gvks:
            kind = kinds.served(gvk)
            if kind is None:
                log.info("cluster %s: %s is not a kind the gateway keeps; skipped", cluster,
                         "/".join(gvk))  # fmt: skip
            else:
                kept.add(kind)
        entry = _Cluster(cluster, self._connect(cluster, token), frozenset(kept))
        self.clusters[cluster] = entry
        self._tg.start_soon(self._run, entry, name=f"cluster-{cluster}")
        log.info("cluster %s subscribed (keeping %s)", cluster,
                 ", ".join(sorted(k.plural for k in kept)) or "nothing")  # fmt: skip
        return True

    def unsubscribe(self, cluster: str) -> bool:
        entry = self.clusters.pop(cluster, None)
        if entry is None:
            return False
        entry.scope.cancel()
        self._hub.publish(Event(None, "DELETED", cluster, None))
        log.info("cluster %s unsubscribed", cluster)
        return True

    async def read(
        self, kind: Kind, clusters: Iterable[str], namespace: str | None
    ) -> dict[str, list[dict[str, Any]]]:
        """Objects of ``kind`` by cluster, for every named cluster that can answer now."""
        out: dict[str, list[dict[str, Any]]] = {}
        for cluster in sorted(set(clusters) or self.clusters):
            entry = self.clusters.get(cluster)
            if entry is None or not entry.ready:
                continue
            if kind in entry.kept:
                if kind.plural in entry.synced:
                    cache = entry.caches.get(kind.plural, {})
                    out[cluster] = [o for (ns, _), o in sorted(cache.items())
                                    if not namespace or ns == namespace]  # fmt: skip
                continue
            try:
                listed = await entry.api.get(
                    kinds.collection_path(kind, namespace), [("resourceVersion", "0")]
                )
            except errors.NotFound:
                out[cluster] = []  # the cluster does not serve this kind
            except errors.ApiError as e:
                log.warning("cluster %s: cannot list %s: %s", cluster, kind.plural, e)
            else:
                out[cluster] = [o for o in listed.get("items") or [] if isinstance(o, dict)]
        return out

    async def _run(self, entry: _Cluster) -> None:
        """Wait out readiness, then keep the kinds, until unsubscribed (cancelled)."""
        with entry.scope:
            pauses = kinds.backoff(*self._settings.backoff_s)
            failures = 0
            while True:
                try:
                    await self._wait_ready(entry)
                    break
                except NotReady as e:
                    entry.reason = str(e)
                    level = logging.WARNING if failures == 0 else logging.DEBUG
                    log.log(level, "cluster %s is not ready: %s", entry.id, e)
                    failures += 1
                    await anyio.sleep(next(pauses))
            log.info("cluster %s is ready", entry.id)
            entry.ready, entry.reason = True, "ready"
            async with anyio.create_task_group() as tg:
                for kind in entry.kept:
                    tg.start_soon(self._keep, entry, kind, name=f"{entry.id}-{kind.plural}")
                await anyio.sleep_forever()  # nothing kept: other kinds are listed live

    async def _wait_ready(self, entry: _Cluster) -> None:
        """Both APIServices Available, checked every poll up to the timeout.

        The poll is never longer than the timeout, so every check round asks at least once.
        """
        last = "not checked"
        timeout = self._settings.readiness_timeout_s
        poll = min(self._settings.readiness_poll_s, timeout)
        with anyio.move_on_after(timeout + poll / 2):
            while True:
                await anyio.sleep(poll)
                try:
                    last = await self._check(entry) or ""
                except errors.ApiError as e:
                    last = str(e)
                if not last:
                    return
        raise NotReady(last)

    async def _check(self, entry: _Cluster) -> str | None:
        for name in kinds.APISERVICES:
            body = await entry.api.get(kinds.apiservice_path(name), [("resourceVersion", "0")])
            reason = kinds.not_ready_reason(name, body)
            if reason is not None:
                return reason
        return None

    async def _keep(self, entry: _Cluster, kind: Kind) -> None:
        """List then watch ``kind`` for as long as the cluster is subscribed."""
        pauses = kinds.backoff(*self._settings.backoff_s)
        while True:
            try:
                version = await self._list(entry, kind)
                pauses = kinds.backoff(*self._settings.backoff_s)
                if version is None:
                    await anyio.sleep(ABSENT_RETRY_S)
                    continue
                with anyio.move_on_after(self._settings.relist_s or float("inf")):
                    while True:
                        version = await self._watch(entry, kind, version)
            except errors.Gone:
                log.debug("cluster %s: %s watch expired; listing again", entry.id, kind.plural)
            except errors.ApiError as e:
                log.warning("cluster %s: %s: %s", entry.id, kind.plural, e)
                await anyio.sleep(next(pauses))

    async def _list(self, entry: _Cluster, kind: Kind) -> str | None:
        """Replace the cache from a full list; the list's version, None when the kind is absent."""
        try:
            listed = await entry.api.get(
                kinds.collection_path(kind), [("limit", "500"), ("resourceVersion", "0")]
            )
        except errors.NotFound:
            self._replace(entry, kind, {})
            return None
        items = [o for o in listed.get("items") or [] if isinstance(o, dict)]
        self._replace(entry, kind, {_key(o): o for o in items})
        return str((listed.get("metadata") or {}).get("resourceVersion") or "0")

    def _replace(self, entry: _Cluster, kind: Kind, new: dict[Key, dict[str, Any]]) -> None:
        old = entry.caches.get(kind.plural, {})
        entry.caches[kind.plural] = new
        entry.synced.add(kind.plural)
        for key in sorted(set(old) | set(new)):
            if key not in new:
                self._hub.publish(Event(kind.plural, "DELETED", entry.id, old[key]))
            elif key not in old:
                self._hub.publish(Event(kind.plural, "ADDED", entry.id, new[key]))
            elif old[key] != new[key]:
                self._hub.publish(Event(kind.plural, "MODIFIED", entry.id, new[key]))

    async def _watch(self, entry: _Cluster, kind: Kind, version: str) -> str:
        """One watch from ``version`` until the server ends it; the last version seen."""
        query = [("allowWatchBookmarks", "true"), ("resourceVersion", version),
                 ("timeoutSeconds", str(WATCH_SECONDS)), ("watch", "true")]  # fmt: skip
        cache = entry.caches.setdefault(kind.plural, {})
        async for event in entry.api.watch(kinds.collection_path(kind), query):
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            kind_of = str(event.get("type"))
            if kind_of == "DELETED":
                cache.pop(_key(obj), None)
            elif kind_of in ("ADDED", "MODIFIED"):
                cache[_key(obj)] = obj
            else:
                continue  # BOOKMARK: only the version moves
            self._hub.publish(Event(kind.plural, kind_of, entry.id, obj))
        return version

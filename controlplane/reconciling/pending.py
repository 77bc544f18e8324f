"""Each node's pending sliced and partitioned requests, pushed to its device agent on the bus.

kubelet's Allocate names only device IDs; the device agent holds no Kubernetes access, so the
worker, which watches Pods, tells it which containers bound to its node still wait for a sliced or
partitioned device and what each asked for (:class:`bus.records.PendingContainers` under
``pending.<node>``). :func:`pending_for` is the pure decision; :class:`PendingPublisher` keeps a
Pod cache from a list-then-watch and rewrites the record of every node whose answer changed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import msgspec

from bus import kv, records
from bus.errors import BusError
from controlplane import errors
from controlplane.families import SLICING, UNITS, Family, family_of
from controlplane.k8s.client import KubeClient
from controlplane.resources import PODS
from kit.values import parse_quantity

__all__ = ["PendingPublisher", "pending_for"]

log = logging.getLogger(__name__)
_DONE: Final = frozenset({"Running", "Succeeded", "Failed"})
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
VISIBILITY_PREFIX: Final = "device.gpustack.ai/"


def pending_for(node: str, pods: Iterable[Mapping[str, Any]]) -> records.PendingContainers:
    """The containers of ``pods`` bound to ``node`` that may still be allocated a sliced or
    partitioned device: the Pod is scheduled there, not deleted, and not yet running.

    A Pod with a visibility request (the SSH sidecar's ``device.gpustack.ai/<mfr>.visibility``)
    also has its visibility and exclusive or shared claims listed: the agent mirrors the owning
    container's cards to the sidecar, so it must know both belong to one Pod.
    """
    found: list[records.PendingContainer] = []
    for pod in pods:
        spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        if spec.get("nodeName") != node or phase in _DONE or meta.get("deletionTimestamp"):
            continue
        containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
        named = [(str(c.get("name", "")), _limits(c)) for c in containers]
        mirrored = any(_visibility(k) for _, limits in named for k in limits)
        for name, limits in named:
            found += _claims(meta, name, limits)
            if mirrored:
                found += _whole_claims(meta, name, limits)
    found.sort(key=lambda p: (p.created_at, p.namespace, p.pod, p.container))
    return records.PendingContainers(node=node, containers=tuple(found))


def _limits(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return (container.get("resources") or {}).get("limits") or {}


def _visibility(key: str) -> bool:
    return key.startswith(VISIBILITY_PREFIX) and key.endswith(".visibility")


def _whole_claims(
    meta: Mapping[str, Any], container: str, limits: Mapping[str, Any]
) -> list[records.PendingContainer]:
    """The visibility, exclusive and shared claims of one container of a mirrored Pod."""
    out = []
    for key, value in limits.items():
        fam = family_of(key)
        whole = fam is not None and fam[1] in (Family.EXCLUSIVE, Family.SHARED)
        if not (whole or _visibility(key)):
            continue
        count = _int(value)
        if count is None or count < 1:
            continue
        per = 0 if not whole else UNITS if fam and fam[1] is Family.EXCLUSIVE else UNITS // 10
        out.append(
            records.PendingContainer(
                pod_uid=str(meta.get("uid", "")), namespace=str(meta.get("namespace", "")),
                pod=str(meta.get("name", "")), container=container, resource=key, count=count,
                units=per * count, created_at=_created(meta),
            )
        )  # fmt: skip
    return out


def _claims(
    meta: Mapping[str, Any], container: str, limits: Mapping[str, Any]
) -> list[records.PendingContainer]:
    """One entry per sliced or partitioned device resource the container's limits name."""
    out = []
    for key, value in limits.items():
        fam = family_of(key)
        if fam is None or fam[1] not in SLICING or key != f"{fam[0]}.{fam[1].value}":
            continue
        count, units = _int(value), _int(limits.get(f"{key}.units"))
        if count is None or count < 1 or units is None or units < 1:
            continue  # not a claim admission let through: nothing the agent could charge
        out.append(
            records.PendingContainer(
                pod_uid=str(meta.get("uid", "")), namespace=str(meta.get("namespace", "")),
                pod=str(meta.get("name", "")), container=container, resource=key, count=count,
                units=units, memory_percentage=_int(limits.get(f"{key}.memory-percentage")),
                memory_mib=_int(limits.get(f"{key}.memory-mib")),
                cores_percentage=_int(limits.get(f"{key}.cores-percentage")),
                profile=_profile(key, limits) if fam[1] is Family.PARTITIONED else None,
                created_at=_created(meta),
            )
        )  # fmt: skip
    return out


def _int(value: Any) -> int | None:
    if value is None:
        return None
    try:
        q = parse_quantity(value)
    except (ValueError, TypeError):
        return None
    return int(q) if q.denominator == 1 else None


def _profile(key: str, limits: Mapping[str, Any]) -> str | None:
    """``3g.40gb`` from ``<base>.partitioned.<kind>-3g.40gb``."""
    head = f"{key}."
    for k in sorted(limits):
        rest = k.removeprefix(head)
        if k.startswith(head) and rest != "units" and "-" in rest:
            return rest.partition("-")[2]
    return None


def _created(meta: Mapping[str, Any]) -> datetime:
    try:
        return msgspec.convert(meta.get("creationTimestamp"), datetime)
    except msgspec.ValidationError:
        return _EPOCH


class PendingPublisher:
    """Keeps ``pending.<node>`` equal to :func:`pending_for` over the Pods the API holds."""

    def __init__(self, agents: kv.Bucket, *, retry_s: float = 1.0) -> None:
        self._agents = agents
        self._retry_s = retry_s
        self._pods: dict[str, dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, dict[str, Any]]] = {}
        """The cached Pods by node, then uid: a change recomputes one node's Pods only."""
        self._pushed: dict[str, bytes] = {}

    async def watch(self, api: KubeClient, *, timeout_s: int = 300) -> None:
        """List the Pods, publish, then follow their changes, until cancelled; a failed or
        expired watch lists again (a Pod deleted while the watch was down is then dropped)."""
        while True:
            try:
                since: str | None = await self._relist(api)
                while since is not None:
                    since = await self._follow(api, since, timeout_s)
            except (errors.ApiError, BusError) as e:
                log.warning("following Pods for pending requests failed: %s; again", e)
                await anyio.sleep(self._retry_s)

    async def _relist(self, api: KubeClient) -> str:
        body = await api.request("GET", PODS.collection_path())
        items = body.get("items") or []
        self._pods, self._nodes = {}, {}
        for pod in items:
            self._store(str(pod["metadata"]["uid"]), pod)
        for key in await self._agents.keys("pending.>"):  # written by an earlier leader
            self._pushed.setdefault(kv.unescape(key.removeprefix("pending.")), b"?")
        await self._publish({*self._pushed, *self._nodes})
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def _follow(self, api: KubeClient, since: str, timeout_s: int) -> str | None:
        """One watch stream from ``since``; the last version seen, None to list again."""
        try:
            stream = api.watch(PODS, resource_version=since or None, timeout_s=timeout_s)
            async with aclosing(stream):
                async for event in stream:
                    meta = event.object.get("metadata") or {}
                    since = meta.get("resourceVersion") or since
                    if event.type == "BOOKMARK" or "uid" not in meta:
                        continue
                    old = self._store(str(meta["uid"]), event.object, event.type == "DELETED")
                    await self._publish({_node_of(event.object), _node_of(old)})
        except errors.Gone:
            return None
        return since

    def _store(self, uid: str, pod: dict[str, Any], gone: bool = False) -> dict[str, Any]:
        """Cache (or forget) one Pod; the version it replaces, empty when it is new."""
        old = self._pods.pop(uid, None) or {}
        self._nodes.get(_node_of(old), {}).pop(uid, None)
        if not gone:
            self._pods[uid] = pod
            self._nodes.setdefault(_node_of(pod), {})[uid] = pod
        return old

    async def _publish(self, nodes: Iterable[str]) -> None:
        """Write each node's record when it changed; an empty one is deleted, not written."""
        for node in sorted(n for n in nodes if n):
            rec = pending_for(node, self._nodes.get(node, {}).values())
            data = msgspec.json.encode(rec) if rec.containers else b""
            if self._pushed.get(node) == data or (not data and node not in self._pushed):
                continue
            if data:
                await self._agents.put(kv.pending_key(node), data)
                self._pushed[node] = data
            else:
                await self._agents.delete(kv.pending_key(node))
                del self._pushed[node]


def _node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")

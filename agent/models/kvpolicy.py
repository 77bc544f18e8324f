"""A :class:`~agent.models.policy.Policy` filled from the control plane's bus KV bucket.

The worker writes ``nms.<node>`` (this node's NodeModelStore spec) and
``artifacts.<namespace>.<name>`` (resolved ModelArtifacts) into :data:`bus.kv.AGENTS_BUCKET`.
:func:`follow` re-reads the bucket every ``every_s`` into a :class:`MemoryPolicy` (the plugin's
reads stay synchronous and local); the policy counts as synced after the first full read, and each read that changed it is handed
to ``changed`` (the plugin keeps it on disk, :mod:`agent.models.policyfile`). A
malformed record is logged and skipped, never fatal: it only makes its own volumes unauthorized.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import msgspec
from anyio.abc import TaskStatus

from agent.models.policy import MemoryPolicy
from bus import kv, records
from bus.errors import BusError

__all__ = ["follow", "read_once"]

log = logging.getLogger(__name__)


async def read_once(bucket: kv.Bucket, node: str) -> MemoryPolicy:
    """Read every artifact and this node's spec. :raises BusError: the bucket is unreachable.

    All artifacts come from one read of the bucket (:meth:`bus.kv.Bucket.last_values`), not a
    request per key: a cluster with many artifacts does not multiply the cost of a sync.
    """
    artifacts: list[records.ArtifactRecord] = []
    for key, data in await bucket.last_values("artifacts.>"):
        try:
            artifacts.append(msgspec.json.decode(data, type=records.ArtifactRecord))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            log.warning("skipping malformed artifact record %s: %s", key, e)
    spec = None
    got = await bucket.get(kv.nms_key(node))
    if got is not None:
        try:
            raw = msgspec.json.decode(got[0], type=records.StoreSpecRecord)
            spec = msgspec.convert(raw.spec, records.StoreSpec)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            log.warning("malformed NodeModelStore spec for %s: %s", node, e)
    return MemoryPolicy(artifacts, spec)


async def _unchanged(_: MemoryPolicy) -> None:
    pass


async def follow(
    bucket: kv.Bucket,
    node: str,
    policy: MemoryPolicy,
    *,
    every_s: float = 5.0,
    changed: Callable[[MemoryPolicy], Awaitable[None]] = _unchanged,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``policy`` equal to the bucket, re-read every ``every_s``, until cancelled.

    ``changed`` is awaited after a read that changed the view, or was the first (the plugin
    keeps the view on disk for a start without the bus).
    """
    started = False
    while True:
        try:
            fresh = await read_once(bucket, node)
            news = not policy.synced() or fresh.view() != policy.view()
            policy.replace(fresh)
            if news:
                await changed(policy)
        except BusError as e:
            log.warning("cannot read artifacts from the bus (keeping the last view): %s", e)
        if not started:
            started = True
            task_status.started()
        await anyio.sleep(every_s)

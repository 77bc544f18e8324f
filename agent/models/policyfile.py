"""The last policy synced from the bus, kept in the cache root for a start without the bus.

After a restart with NATS down the plugin would otherwise hold no policy at all and refuse
every mount. :func:`save` writes the followed view (the artifact records and this node's store
spec, the :mod:`bus.records` types) whenever it changes, atomically and 0600; :func:`load`
reads it back at start as a *provisional* view (:meth:`MemoryPolicy.assume`): it authorizes
mounts of trees already cached, never a download, until the bus's first read replaces it.

The file is typed and versioned (``format``); a corrupt one, one of another format or of
another node is logged and ignored: the plugin then waits for the bus, as without a file.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec

from agent.models.policy import MemoryPolicy
from bus.records import ArtifactRecord, StoreSpec
from kit.files import InputRefused, read_capped, write_private

__all__ = ["FORMAT", "Unusable", "decode", "encode", "load", "path_in", "save"]

log = logging.getLogger(__name__)

MAX_BYTES = 1024 * 1024
"""The largest kept policy read back (one node's policy is well under a KiB)."""

FORMAT = "gpustack-model-policy/v1"


class Record(msgspec.Struct, frozen=True, kw_only=True, tag=FORMAT, tag_field="format"):
    node: str
    artifacts: tuple[ArtifactRecord, ...] = ()
    spec: StoreSpec | None = None


class Unusable(Exception):
    """The file is not a policy this plugin may start from (says why)."""


def path_in(cache_root: Path) -> Path:
    return cache_root / "ledger" / "policy.json"


def encode(node: str, policy: MemoryPolicy) -> bytes:
    artifacts, spec = policy.view()
    return msgspec.json.encode(Record(node=node, artifacts=artifacts, spec=spec))


def decode(data: bytes, node: str) -> Record:
    """:raises Unusable: corrupt, foreign, or another node's (its spec is not ours)."""
    try:
        record = msgspec.json.decode(data, type=Record)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Unusable(f"not a {FORMAT} file: {e}") from e
    if record.node != node:
        raise Unusable(f"it is node {record.node!r}'s, not {node!r}'s")
    return record


async def save(path: Path, node: str, policy: MemoryPolicy) -> None:
    """Write ``policy``'s view; a failure is logged (the plugin serves on; the next change
    tries again)."""
    data = encode(node, policy)
    try:
        await anyio.to_thread.run_sync(write_private, path, data)
    except OSError as e:
        log.warning("cannot keep the policy in %s: %s", path, e)


async def load(path: Path, node: str) -> Record | None:
    """The policy kept in ``path``; None (logged) when it is missing or unusable."""
    try:  # a regular file, and at most what any policy of one node could need
        data = await anyio.to_thread.run_sync(functools.partial(read_capped, path, limit=MAX_BYTES))
    except InputRefused as e:
        if e.missing:
            return None
        log.warning("cannot read the kept policy: %s", e)
        return None
    try:
        return decode(data, node)
    except Unusable as e:
        log.warning("ignoring the kept policy %s: %s", path, e)
        return None

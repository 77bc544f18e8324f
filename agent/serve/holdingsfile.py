"""The device ledger's holdings kept on the node, so a start without the bus is not empty.

``dm serve`` rebuilds its ledger after a restart from the bus's retained allocation history
(:mod:`agent.serve.restoring`). When the bus cannot be read at start, this file stands in for it:
every ledger change the device plugins publish is also folded in here and written whole
(atomically, mode 0600). Kubelet's pod-resources API corrects either source afterwards.

The file is typed and versioned (``format``); one of another format or another node is logged
and ignored, never trusted: a wrong ledger refuses Allocates that should pass.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread
import msgspec

from bus import events
from kit.files import InputRefused, read_capped, write_private

__all__ = ["FORMAT", "LedgerFile", "Unusable", "decode", "encode", "fold", "load"]

log = logging.getLogger(__name__)

MAX_BYTES = 64 * 1024 * 1024
"""The largest kept ledger read back: a node's allocations are a few hundred bytes each."""

FORMAT = "gpustack-device-ledger/v1"


class Record(msgspec.Struct, frozen=True, kw_only=True, tag=FORMAT, tag_field="format"):
    """The file's whole content: the allocations in force on ``node``."""

    node: str
    allocations: tuple[events.AllocationEvent, ...] = ()


class Unusable(Exception):
    """The file is not a ledger this agent may start from (says why)."""


def fold(
    held: Mapping[str, events.AllocationEvent], event: events.AllocationEvent
) -> dict[str, events.AllocationEvent]:
    """What is in force after ``event``: the latest ``allocated`` per id, ``released`` gone."""
    fresh = dict(held)
    if event.action == "allocated":
        fresh[event.allocation_id] = event
    else:
        fresh.pop(event.allocation_id, None)
    return fresh


def encode(node: str, allocations: Iterable[events.AllocationEvent]) -> bytes:
    ordered = tuple(sorted(allocations, key=lambda e: e.allocation_id))
    return msgspec.json.encode(Record(node=node, allocations=ordered))


def decode(data: bytes, node: str) -> list[events.AllocationEvent]:
    """The allocations a file holds for ``node``. :raises Unusable: corrupt, foreign, another
    node's (a copied state directory must not charge this node's cards)."""
    try:
        record = msgspec.json.decode(data, type=Record)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Unusable(f"not a {FORMAT} file: {e}") from e
    if record.node != node:
        raise Unusable(f"it is node {record.node!r}'s, not {node!r}'s")
    return [e for e in record.allocations if e.node == node and e.action == "allocated"]


async def load(path: Path, node: str) -> list[events.AllocationEvent]:
    """The allocations kept in ``path``; none (logged) when it is missing or unusable."""
    try:  # a regular file, and at most what any ledger of one node could need
        data = await anyio.to_thread.run_sync(functools.partial(read_capped, path, limit=MAX_BYTES))
    except InputRefused as e:
        if e.missing:
            log.info("no local ledger at %s", path)
            return []
        log.warning("cannot read the local ledger (starting empty): %s", e)
        return []
    try:
        return decode(data, node)
    except Unusable as e:
        log.warning("ignoring the local ledger %s: %s", path, e)
        return []


class LedgerFile:
    """Folds the plugins' allocation events and keeps ``path`` equal to them.

    :meth:`note` is synchronous and never blocks (it runs inside the publish callback);
    :meth:`keep` writes the latest state in a worker thread, coalescing bursts of changes.
    """

    def __init__(
        self, path: Path, node: str, initial: Sequence[events.AllocationEvent] = ()
    ) -> None:
        self.path = path
        self.node = node
        self._held = {e.allocation_id: e for e in initial if e.action == "allocated"}
        self._version = 1  # the starting state is written too: it is what the ledger holds
        self._saved = 0
        self._wake = anyio.Event()

    def note(self, event: events.Event) -> None:
        if not isinstance(event, events.AllocationEvent) or event.node != self.node:
            return
        self._held = fold(self._held, event)
        self._version += 1
        self._wake.set()

    async def keep(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Write every change until cancelled, and once more (shielded) on the way out."""
        try:
            await self._save()
            task_status.started()
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                await self._save()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
                await self._save()

    async def _save(self) -> None:
        """Write the current state if it is newer than the file; a failure is logged (the
        agent keeps serving kubelet; the next change tries again)."""
        if self._saved == self._version:
            return
        version, data = self._version, encode(self.node, self._held.values())
        try:
            await anyio.to_thread.run_sync(write_private, self.path, data)
        except OSError as e:
            log.warning("cannot write the local ledger %s: %s", self.path, e)
            return
        self._saved = version

"""The pending-containers follower keeps its last view when the bus fails or the record is bad."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import anyio
import msgspec
import pytest

from agent.deviceplugin import kvpending
from bus import kv
from bus.errors import StateUnavailable
from bus.records import PendingContainer, PendingContainers

pytestmark = pytest.mark.anyio

ONE = PendingContainer(
    pod_uid="u", namespace="ns", pod="p", container="main", resource="nvidia.com/gpu.sliced",
    units=400_000, created_at=datetime(2026, 1, 1, tzinfo=UTC),
)  # fmt: skip


class Replies:
    """A bucket whose ``get`` answers from a script: bytes, None (absent) or an error."""

    def __init__(self, *replies: bytes | None | Exception) -> None:
        self.replies = list(replies)

    async def get(self, key: str) -> tuple[bytes, int] | None:
        assert key == kv.pending_key("n1")
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, Exception):
            raise reply
        return None if reply is None else (reply, 1)


async def test_an_unreachable_bus_or_a_bad_record_keeps_the_last_view() -> None:
    good = msgspec.json.encode(PendingContainers(node="n1", containers=(ONE,)))
    bucket = Replies(good, StateUnavailable("down"), b"{not json")
    view = kvpending.PendingView()
    with anyio.move_on_after(0.2):
        await kvpending.follow(cast(kv.Bucket, bucket), "n1", view, every_s=0.01)
    assert view() == (ONE,)
    assert view.reads == 1


async def test_an_absent_key_means_nothing_pending() -> None:
    bucket = cast(kv.Bucket, Replies(None))
    assert await kvpending.read_once(bucket, "n1") == ()

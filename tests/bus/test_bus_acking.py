"""Pipelined acknowledgements: every flight ends exactly once, whatever the answer (or none)."""

from __future__ import annotations

import anyio
import pytest

from bus import acking, codec, connection, state, subjects, testing
from bus.errors import BusError, PublishFailed
from bus.settings import BusSettings

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


def test_outcome_reads_acks_errors_and_silence() -> None:
    assert acking.outcome("s", b'{"stream":"GPUSTACK_V1_STATE","seq":7}') is None
    refused = acking.outcome("s", b'{"error":{"code":503,"description":"no quorum"}}')
    assert isinstance(refused, PublishFailed) and "no quorum" in str(refused)
    assert isinstance(acking.outcome("s", b""), PublishFailed)  # no responders
    assert isinstance(acking.outcome("s", b"\xff not json"), PublishFailed)
    assert isinstance(acking.outcome("s", b'{"seq":1}'), PublishFailed)


def _payload() -> bytes:
    return codec.encode(testing.example_events("n1")[5])


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[BusError | None] = []
        self.changed = anyio.Event()

    def __call__(self, failure: BusError | None) -> None:
        self.seen.append(failure)
        self.changed.set()

    async def wait(self, count: int) -> None:
        with anyio.fail_after(10):
            while len(self.seen) < count:
                self.changed = anyio.Event()
                await self.changed.wait()


async def test_stored_refused_expired_and_closed_flights_each_end_once(
    conn: connection.Connection, settings: BusSettings
) -> None:
    await state.ensure_streams(conn, settings)
    stored, unrouted, expired, closed = Outcomes(), Outcomes(), Outcomes(), Outcomes()
    subject = subjects.subject("n1", "agent")
    async with acking.ack_window(conn, timeout_s=5) as window:
        await window.send(subject, _payload(), stored)
        await window.send("not.captured.by.any.stream", b"{}", unrouted)
        await stored.wait(1)
        await unrouted.wait(1)
        assert stored.seen == [None]
        assert isinstance(unrouted.seen[0], PublishFailed)
        await window.send(subject, _payload(), expired)
        assert window.expire(anyio.current_time() + 6) == 1  # as if no answer came in time
        await window.send(subject, _payload(), closed)
        window.close()  # before its answer can arrive (no await in between)
        await conn.flush()  # the answers to the expired and closed flights come back here
    assert isinstance(expired.seen[0], PublishFailed)
    assert isinstance(closed.seen[0], PublishFailed)
    await anyio.sleep(0.05)  # late answers to the expired flight change nothing
    assert [len(o.seen) for o in (stored, unrouted, expired, closed)] == [1, 1, 1, 1]
    with pytest.raises(PublishFailed):
        await window.send(subject, _payload(), closed)

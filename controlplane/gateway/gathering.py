"""One gather round: ask every member worker on the bus for its summary, collect the answers.

NATS scatter-gather: one request published on :data:`bus.fleet.SUMMARY_SUBJECT` with a private
reply inbox; each member cluster answers once (its replicas share a queue group). The round ends
when the readiness timeout passes, or earlier once every member known from earlier rounds has
answered and ``settle_s`` has passed (so a healthy fleet is polled in milliseconds, and a new
member still has ``settle_s`` to be heard). Answers that do not decode are logged and dropped;
answers beyond ``max_replies`` are dropped (a bound on memory, whatever members send).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

import anyio

from bus import fleet
from bus.connection import Connection
from bus.fleet import MemberSummary

__all__ = ["Gathered", "gather"]

log = logging.getLogger(__name__)


@dataclass
class Gathered:
    replies: list[MemberSummary] = field(default_factory=list)
    invalid: int = 0
    dropped: int = 0


async def gather(
    conn: Connection,
    *,
    timeout_s: float,
    expected: Collection[str],
    settle_s: float,
    max_replies: int,
) -> Gathered:
    """Run one round; never raises for what members send (bus errors propagate)."""
    out = Gathered()
    heard: set[str] = set()
    complete = anyio.Event()

    def on_message(_: str, payload: bytes) -> None:
        if len(out.replies) >= max_replies:
            out.dropped += 1
            return
        try:
            summary = fleet.decode_summary(payload)
        except fleet.InvalidSummary as e:
            out.invalid += 1
            log.warning("fleet: %s", e)
            return
        out.replies.append(summary)
        heard.add(summary.cluster)
        if expected and heard.issuperset(expected):
            complete.set()

    inbox = conn.new_inbox()
    async with conn.subscribe(inbox, on_message):
        await conn.publish(fleet.SUMMARY_SUBJECT, fleet.encode(fleet.SummaryRequest()), reply=inbox)
        with anyio.move_on_after(timeout_s):
            await anyio.sleep(min(settle_s, timeout_s))
            await complete.wait()
    return out

"""Which member clusters count: the membership book after each gather round (pure).

A member is **Active** when it answered the last round in time and said it is ready,
**NotReady** when it answered but is not ready, and **Unreachable** when it did not answer within
the readiness timeout. Only Active members count towards the fleet totals; the others stay listed
with their last answer so a dashboard can say what is missing, and they come back as soon as they
answer again. A member silent for ``forget_after_s`` is forgotten.

Invariants: one entry per cluster name whatever the number of answers it sent in a round (the
last one wins — no double counting); at most ``max_members`` entries (new clusters beyond that are
refused and reported, known ones always update).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal

import msgspec

from bus.fleet import MemberSummary

__all__ = ["ACTIVE", "MemberState", "Round", "State", "after_round", "replies_by_cluster"]

State = Literal["Active", "NotReady", "Unreachable"]
ACTIVE: Final = "Active"


class MemberState(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str
    state: State
    summary: MemberSummary
    """The member's last answer (kept while it is unreachable, for listing)."""
    last_seen: float
    """When it last answered (the gateway's monotonic clock)."""
    since: float
    """When it entered ``state``."""


class Round(msgspec.Struct, frozen=True, kw_only=True):
    book: dict[str, MemberState]
    refused: tuple[str, ...] = ()
    """New clusters not admitted because the book was full."""
    changed: tuple[str, ...] = ()
    """Clusters whose state changed this round (for logs)."""


def replies_by_cluster(replies: Sequence[MemberSummary]) -> dict[str, MemberSummary]:
    """One answer per cluster: the last one received."""
    return {r.cluster: r for r in replies}


def after_round(
    book: Mapping[str, MemberState],
    replies: Mapping[str, MemberSummary],
    now: float,
    *,
    max_members: int,
    forget_after_s: float,
) -> Round:
    """The book once a round that ended at ``now`` received ``replies``."""
    out: dict[str, MemberState] = {}
    changed: list[str] = []
    for cluster, old in book.items():
        reply = replies.get(cluster)
        if reply is None:
            if now - old.last_seen > forget_after_s:
                changed.append(cluster)
                continue
            out[cluster] = _moved(old, "Unreachable", old.summary, old.last_seen, now, changed)
        else:
            state: State = "Active" if reply.ready else "NotReady"
            out[cluster] = _moved(old, state, reply, now, now, changed)
    refused: list[str] = []
    for cluster in sorted(set(replies) - set(book)):
        if len(out) >= max_members:
            refused.append(cluster)
            continue
        reply = replies[cluster]
        state = "Active" if reply.ready else "NotReady"
        out[cluster] = MemberState(
            cluster=cluster, state=state, summary=reply, last_seen=now, since=now
        )
        changed.append(cluster)
    return Round(book=out, refused=tuple(refused), changed=tuple(sorted(changed)))


def _moved(
    old: MemberState,
    state: State,
    summary: MemberSummary,
    last_seen: float,
    now: float,
    changed: list[str],
) -> MemberState:
    if state != old.state:
        changed.append(old.cluster)
        return MemberState(
            cluster=old.cluster, state=state, summary=summary, last_seen=last_seen, since=now
        )
    return msgspec.structs.replace(old, summary=summary, last_seen=last_seen)

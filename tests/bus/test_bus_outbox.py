"""Outbox decisions (pure): samples drop oldest-first, state events coalesce per key."""

from __future__ import annotations

import msgspec

from bus import events, testing
from bus.publishing import Outbox


def _sample(node: str, seq: int) -> events.SamplesEvent:
    ev = testing.example_events(node, seq=seq)[1]
    assert isinstance(ev, events.SamplesEvent)
    return ev


def test_samples_drop_oldest_first() -> None:
    box = Outbox(max_samples=3)
    dropped = [box.put(_sample("n", i)) for i in range(5)]
    assert [d is not None for d in dropped] == [False, False, False, True, True]
    assert len(box) == 3
    head = box.peek_sample()
    assert head is not None
    assert (
        msgspec.json.decode(head.payload)["samples"][0]["accelerators"][0]["coresUtilization"] == 2
    )


def test_state_events_coalesce_per_node_kind_and_key() -> None:
    box = Outbox(max_samples=1)
    for seq in range(100):
        for node in ("a", "b.c"):
            for ev in testing.example_events(node, seq=seq):
                if not isinstance(ev, events.SamplesEvent):
                    box.put(ev)
    # health keyed by accelerator, allocations by allocation id (a new id each seq).
    keys = [k for k, _ in box.states()]
    assert len(keys) == len(set(keys))
    assert len(keys) == 2 * (4 + 100)
    latest = {k: msgspec.json.decode(p.payload) for k, p in box.states()}
    assert latest[("gpustack.v1.node.b%2Ec.agent", "")]["version"] == "0.1.99"


def test_sent_keeps_a_newer_replacement() -> None:
    box = Outbox(max_samples=1)
    old, new = testing.example_events("n", seq=1)[0], testing.example_events("n", seq=2)[0]
    box.put(old)
    [(key, first)] = box.states()
    box.put(new)
    box.sent(key, first)  # the ack of the old one must not drop the new one
    [(_, left)] = box.states()
    assert msgspec.json.decode(left.payload)["groups"][0]["memory"] == 143771 + 2
    box.sent(key, left)
    assert len(box) == 0

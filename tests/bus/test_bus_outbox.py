"""Outbox decisions (pure): samples drop oldest-first, state events coalesce per key."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from bus import events, testing
from bus.outbox import Key, Outbox, Pending


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


def _health(node: str, accel: str, seq: int) -> events.HealthEvent:
    ev = testing.example_events(node, seq=seq)[2]
    assert isinstance(ev, events.HealthEvent)
    return msgspec.structs.replace(ev, accelerator_id=accel, reason=f"r{seq}")


def _reason(item: Pending) -> str:
    return str(msgspec.json.decode(item.payload)["reason"])


def test_one_flight_per_subject_and_the_ack_of_an_old_one_keeps_the_new_one() -> None:
    box = Outbox(max_samples=1)
    box.put(_health("n", "a", 1))
    taken = box.take()
    assert taken is not None
    box.put(_health("n", "a", 2))
    box.put(_health("n", "b", 3))  # another key, same subject: waits too
    assert box.take() is None
    box.acked(*taken)
    assert len(box) == 2
    second = box.take()
    assert second is not None and _reason(second[1]) == "r2"
    box.acked(*taken)  # a stale ack changes nothing
    assert len(box) == 2
    box.acked(*second)
    third = box.take()
    assert third is not None and _reason(third[1]) == "r3"
    box.acked(*third)
    assert len(box) == 0


def test_subjects_fly_in_parallel() -> None:
    box = Outbox(max_samples=1)
    for node in ("a", "b", "c"):
        box.put(_health(node, "x", 0))
    flights = [box.take() for _ in range(3)]
    assert all(f is not None for f in flights) and box.inflight == 3
    assert box.take() is None


def test_failed_goes_first_unless_replaced() -> None:
    box = Outbox(max_samples=1)
    box.put(_health("n", "a", 1))
    first = box.take()
    assert first is not None
    box.put(_health("n", "b", 2))
    box.failed(*first)  # older than b: retried before it
    again = box.take()
    assert again is not None and _reason(again[1]) == "r1"
    box.put(_health("n", "a", 3))
    box.failed(*again)  # replaced meanwhile: the newer one stays, in publication order
    order = []
    while (t := box.take()) is not None:
        order.append(_reason(t[1]))
        box.acked(*t)
    assert order == ["r2", "r3"]
    assert len(box) == 0


_ops = st.lists(
    st.tuples(st.sampled_from(["put", "take", "ack", "fail"]), st.integers(0, 5)), max_size=80
)


@given(_ops)
def test_any_interleaving_stores_each_subject_in_order_and_ends_with_the_latest(
    ops: list[tuple[str, int]],
) -> None:
    """A model check: whatever the acks and failures, per subject the stored sequence only moves
    forward, and once everything is acknowledged every key's last stored event is its newest."""
    box = Outbox(max_samples=1)
    flying: list[tuple[Key, Pending]] = []
    stored: dict[str, list[int]] = {}
    latest: dict[tuple[str, str], int] = {}
    seq = 0
    for op, n in ops:
        if op == "put":
            seq += 1
            node, accel = f"n{n % 2}", f"a{n % 3}"
            box.put(_health(node, accel, seq))
            latest[(node, accel)] = seq
        elif op == "take" and (t := box.take()) is not None:
            flying.append(t)
        elif flying:
            key, item = flying.pop(n % len(flying))
            if op == "ack":
                box.acked(key, item)
                stored.setdefault(key[0], []).append(int(_reason(item)[1:]))
            else:
                box.failed(key, item)
    assert box.inflight == len(flying) <= 2  # one per subject (two nodes)
    for key, item in flying:
        box.failed(key, item)
    while (t := box.take()) is not None:
        box.acked(*t)
        stored.setdefault(t[0][0], []).append(int(_reason(t[1])[1:]))
    assert len(box) == 0
    for subject, seqs in stored.items():
        assert seqs == sorted(seqs), subject  # never an older one after a newer one
    for (node, _accel), s in latest.items():
        assert s in stored[f"gpustack.v1.node.{node}.health"]  # every key's newest got stored

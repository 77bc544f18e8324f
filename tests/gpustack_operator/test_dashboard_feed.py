"""The dashboard's feed: what a page gets when it opens (pure, no loop)."""

from __future__ import annotations

import msgspec

from bus import codec, events, testing
from gpustack_operator.dashboard.feed import Feed


def _kinds(replay: list[bytes]) -> list[tuple[str, str]]:
    docs = [msgspec.json.decode(d) for d in replay]
    return [(d["node"], d["kind"]) for d in docs]


def test_replay_holds_every_kind_of_every_node_in_wire_form() -> None:
    feed = Feed()
    for node in ("a.one", "b.two"):
        for ev in testing.example_events(node):
            assert feed.apply(ev, now=0.0) == codec.encode(ev)
    replay = feed.replay()
    assert sorted(_kinds(replay)) == sorted(
        (n, k)
        for n in ("a.one", "b.two")
        for k in ("devices", "samples", "health", "allocations", "models", "agent")
    )
    # Decodable by the bus's own strict decoder: the page gets exactly the wire contract.
    for data, (node, kind) in zip(replay, _kinds(replay), strict=True):
        assert codec.decode(data, kind=kind, node=node, max_bytes=1 << 20).node == node  # type: ignore[arg-type]


def test_last_values_replace_and_released_allocations_leave() -> None:
    feed = Feed()
    first, second = testing.example_events("n", seq=0), testing.example_events("n", seq=1)
    for ev in first + second:
        feed.apply(ev, now=0.0)
    docs = [msgspec.json.decode(d) for d in feed.replay()]
    agents = [d for d in docs if d["kind"] == "agent"]
    assert [a["version"] for a in agents] == ["0.1.1"]
    held = sorted(d["allocationId"] for d in docs if d["kind"] == "allocations")
    assert held == ["pod-0/main", "pod-1/main"]
    allocated = second[3]
    assert isinstance(allocated, events.AllocationEvent)
    feed.apply(msgspec.structs.replace(allocated, action="released"), now=0.0)
    docs = [msgspec.json.decode(d) for d in feed.replay()]
    assert [d["allocationId"] for d in docs if d["kind"] == "allocations"] == ["pod-0/main"]


def test_histories_are_bounded_and_a_reread_is_kept_once() -> None:
    feed = Feed(samples_kept=3, health_kept=2)
    for seq in range(6):
        evs = testing.example_events("n", seq=seq)
        feed.apply(evs[1], now=0.0)  # samples
        feed.apply(evs[1], now=0.0)  # the same sample again: a retained-state re-read
        feed.apply(evs[2], now=0.0)  # health
    docs = [msgspec.json.decode(d) for d in feed.replay()]
    utils = [
        d["samples"][0]["accelerators"][0]["coresUtilization"]
        for d in docs
        if d["kind"] == "samples"
    ]
    assert utils == [3, 4, 5]  # the newest three, in delivery order, once each
    assert len([d for d in docs if d["kind"] == "health"]) == 2


def test_silent_nodes_expire_and_the_node_count_is_bounded() -> None:
    feed = Feed(max_nodes=2, max_age_s=60.0)
    feed.apply(testing.example_events("old")[0], now=0.0)
    feed.apply(testing.example_events("new")[0], now=50.0)
    extra = testing.example_events("third")[0]
    assert feed.apply(extra, now=50.0) == codec.encode(extra)  # still passed on live
    assert feed.nodes == ["old", "new"]  # but not kept
    assert feed.expire(now=61.0) == ["old"]
    assert feed.nodes == ["new"]
    feed.apply(extra, now=62.0)
    assert feed.nodes == ["new", "third"]

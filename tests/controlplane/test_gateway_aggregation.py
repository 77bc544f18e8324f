"""The gateway's decisions, without a loop: membership, aggregation, watch events."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from bus import fleet
from bus.fleet import InstanceTypeSummary, MemberSummary, PartitionedView, ProfileCount, View, Views
from controlplane.gateway import aggregation, membership
from controlplane.gateway.catalog import Catalog, changes


def _type(
    name: str,
    ex: tuple[int, int, int],
    sl: tuple[int, int, int] = (0, 0, 0),
    *,
    profiles: dict[str, int] | None = None,
    inactive: bool = False,
) -> InstanceTypeSummary:
    part = PartitionedView(
        once_max_request=1 if profiles else 0,
        remaining=sum((profiles or {}).values()),
        capacity=7 if profiles else 0,
        remaining_profiles=tuple(
            ProfileCount(name=n, count=c) for n, c in (profiles or {}).items()
        ),
    )
    return InstanceTypeSummary(
        name=name,
        views=Views(
            accelerator=View(once_max_request=ex[0], remaining=ex[1], capacity=ex[2]),
            accelerator_sliced=View(once_max_request=sl[0], remaining=sl[1], capacity=sl[2]),
            accelerator_partitioned=part,
        ),
        inactive=inactive,
    )  # fmt: skip


def _member(cluster: str, *types: InstanceTypeSummary, ready: bool = True) -> MemberSummary:
    return MemberSummary(cluster=cluster, ready=ready, instance_types=types)


def _book(*replies: MemberSummary, now: float = 10.0) -> dict[str, membership.MemberState]:
    r = membership.after_round(
        {}, membership.replies_by_cluster(replies), now, max_members=10, forget_after_s=100
    )
    return r.book


H200 = "nvidia-h200-linux-amd64"


def test_the_totals_are_the_sums_of_active_members() -> None:
    book = _book(
        _member("east", _type(H200, (8, 12, 16), (100, 350, 1600))),
        _member("west", _type(H200, (4, 4, 8), (50, 50, 800))),
        _member("north", _type(H200, (8, 8, 8)), ready=False),
    )
    obj = aggregation.aggregate(book)[H200]
    status = obj["status"]
    assert status["accelerator"] == {"onceMaxRequest": 8, "remaining": 16, "capacity": 24}
    assert status["acceleratorSliced"] == {
        "onceMaxRequest": 100,
        "remaining": 400,
        "capacity": 2400,
    }
    assert status["activeMembers"] == 2
    assert [m["state"] for m in status["members"]] == ["Active", "NotReady", "Active"]
    assert status["tiers"]["accelerator"] == [
        {"onceMaxRequest": 8, "clusters": ["east"], "remaining": 12, "capacity": 16},
        {"onceMaxRequest": 4, "clusters": ["west"], "remaining": 4, "capacity": 8},
    ]
    assert status["summary"] == "8/16 0/0 100/400 0/0"
    assert obj["kind"] == "AggregatedInstanceType" and obj["metadata"] == {"name": H200}


def test_members_on_one_level_share_a_tier_and_profiles_are_summed() -> None:
    book = _book(
        _member("a", _type("mig", (0, 0, 8), profiles={"1g.18gb": 7, "7g.141gb": 0})),
        _member("b", _type("mig", (0, 0, 8), profiles={"1g.18gb": 3, "3g.71gb": 1})),
    )
    status = aggregation.aggregate(book)["mig"]["status"]
    assert status["tiers"]["accelerator"] == [
        {"onceMaxRequest": 0, "clusters": ["a", "b"], "remaining": 0, "capacity": 16}
    ]
    assert status["acceleratorPartitioned"]["remainingProfiles"] == [
        {"name": "1g.18gb", "count": 10}, {"name": "3g.71gb", "count": 1},
        {"name": "7g.141gb", "count": 0},
    ]  # fmt: skip


def test_an_inactive_type_is_listed_but_not_counted() -> None:
    book = _book(
        _member("a", _type(H200, (8, 8, 8), inactive=True)), _member("b", _type(H200, (2, 2, 8)))
    )
    status = aggregation.aggregate(book)[H200]["status"]
    assert status["accelerator"]["remaining"] == 2
    assert status["members"][0] == {"cluster": "a", "state": "Active", "inactive": True}


def test_a_member_answering_twice_counts_once() -> None:
    first = _member("a", _type(H200, (8, 8, 8)))
    second = _member("a", _type(H200, (8, 5, 8)), _type(H200, (8, 6, 8)))
    status = aggregation.aggregate(_book(first, second))[H200]["status"]
    assert status["accelerator"] == {"onceMaxRequest": 8, "remaining": 6, "capacity": 8}


def test_unreachable_then_back_then_forgotten() -> None:
    kw: dict[str, Any] = {"max_members": 10, "forget_after_s": 100.0}
    reply = _member("a", _type(H200, (8, 8, 8)))
    r1 = membership.after_round({}, {"a": reply}, 0.0, **kw)
    r2 = membership.after_round(r1.book, {}, 5.0, **kw)
    assert r2.book["a"].state == "Unreachable" and r2.changed == ("a",)
    assert aggregation.aggregate(r2.book)[H200]["status"]["accelerator"]["remaining"] == 0
    r3 = membership.after_round(r2.book, {"a": reply}, 6.0, **kw)
    assert r3.book["a"].state == "Active" and r3.book["a"].since == 6.0
    r4 = membership.after_round(r3.book, {}, 7.0, **kw)
    assert r4.book["a"].since == 7.0
    assert membership.after_round(r4.book, {}, 106.5, **kw).book == {}


def test_a_full_book_refuses_new_members_but_updates_known_ones() -> None:
    kw: dict[str, Any] = {"max_members": 1, "forget_after_s": 100.0}
    r1 = membership.after_round({}, {"a": _member("a"), "b": _member("b")}, 0.0, **kw)
    assert list(r1.book) == ["a"] and r1.refused == ("b",)
    r2 = membership.after_round(
        r1.book, {"a": _member("a", ready=False), "c": _member("c")}, 1.0, **kw
    )
    assert r2.book["a"].state == "NotReady" and r2.refused == ("c",)


def test_the_aggregate_is_deterministic() -> None:
    one = _book(_member("b", _type("x", (1, 1, 1))), _member("a", _type("y", (2, 2, 2))))
    two = _book(_member("a", _type("y", (2, 2, 2))), _member("b", _type("x", (1, 1, 1))))
    enc = msgspec.json.encode
    assert enc(aggregation.aggregate(one)) == enc(aggregation.aggregate(two))


def test_the_catalog_stamps_versions_and_tells_watchers_only_changes() -> None:
    catalog = Catalog()
    book = _book(_member("a", _type("x", (1, 1, 1)), _type("y", (2, 2, 2))))
    events = catalog.update(book)
    assert [(k, o["metadata"]["name"]) for k, o in events] == [("ADDED", "x"), ("ADDED", "y")]
    assert catalog.version == 1 and catalog.ready
    assert catalog.update(book) == [] and catalog.version == 1
    changed = _book(_member("a", _type("x", (1, 0, 1))))
    events = catalog.update(changed)
    assert [(k, o["metadata"]["name"]) for k, o in events] == [("MODIFIED", "x"), ("DELETED", "y")]
    assert catalog.objects["x"]["metadata"]["resourceVersion"] == "2"
    listed = catalog.as_list()
    assert listed["metadata"]["resourceVersion"] == "2" and len(listed["items"]) == 1


def test_changes_ignore_resource_versions() -> None:
    obj = {"metadata": {"name": "x", "resourceVersion": "3"}, "status": {}}
    assert changes({"x": obj}, {"x": {"metadata": {"name": "x"}, "status": {}}}) == []


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"not json", "unreadable"),
        (b'{"cluster": "Bad_Name"}', "invalid cluster"),
        (b'{"cluster": "a", "instanceTypes": [{"name": "x", "views": {"accelerator": {"remaining": -1}}}]}', "unreadable"),
        (b"x" * (fleet.MAX_SUMMARY_BYTES + 1), "bytes"),
    ],
)  # fmt: skip
def test_a_hostile_answer_is_refused_with_a_reason(payload: bytes, why: str) -> None:
    with pytest.raises(fleet.InvalidSummary, match=why):
        fleet.decode_summary(payload)


def test_the_wire_format_is_camel_case_and_omits_defaults() -> None:
    wire = fleet.encode(_member("a", _type("x", (1, 1, 2))))
    assert b'"instanceTypes"' in wire and b'"onceMaxRequest":1' in wire
    assert b'"acceleratorShared"' not in wire
    assert fleet.decode_summary(wire) == _member("a", _type("x", (1, 1, 2)))

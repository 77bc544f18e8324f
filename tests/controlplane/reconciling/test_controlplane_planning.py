"""Pure decisions: queue coalescing, ledger folds, allocation status, labels, plans."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from bus import events
from bus.devices import DeviceGroup
from controlplane.k8s.limiting import TokenBucket
from controlplane.reconciling import allocating, labeling
from controlplane.reconciling.nodestates import Ledger, Refused
from controlplane.reconciling.planning import (
    WHOLE,
    Create,
    Delete,
    Desired,
    Patch,
    merge_patch,
    plan,
)
from controlplane.reconciling.queueing import KeyQueue
from controlplane.resources import DEVICES, Observed, Ref
from controlplane.worker import leading

HERE = Path(__file__).parents[1]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def groups(name: str = "controlplane_detect_h100x8_mig.json") -> tuple[DeviceGroup, ...]:
    return msgspec.json.decode((HERE / name).read_bytes(), type=tuple[DeviceGroup, ...])


def test_queue_coalesces_and_serializes() -> None:
    q: KeyQueue[str] = KeyQueue(max_keys=2)
    assert all(q.add("a") for _ in range(100))
    assert q.add("b") and not q.add("c")  # full: a new key is refused
    assert q.take() == "a"
    assert q.add("a")  # in flight: marked dirty, not handed out twice
    assert q.take() == "b" and q.take() is None
    assert q.done("a") is True and q.take() == "a"
    assert q.done("a") is False and q.done("b") is False and len(q) == 0


def test_queue_takes_updates_first_but_starves_no_lane() -> None:
    q: KeyQueue[str] = KeyQueue(max_keys=100)
    for i in range(3):
        assert q.add(f"new{i}")  # first creations
    for i in range(6):
        assert q.add(f"up{i}", first=True)  # nodes whose objects exist
    assert q.add("new0", first=True)  # already waiting: stays where it is
    taken = [q.take() for _ in range(9)]
    assert taken == ["up0", "up1", "up2", "up3", "new0", "up4", "up5", "new1", "new2"]
    assert q.take() is None
    assert q.add("new1", first=True)  # in flight: goes back to the first lane when done
    assert q.add("new9")
    assert q.done("new1") is True and q.take() == "new1" and q.take() == "new9"
    assert q.holds("new9") and q.done("new9") is False and not q.holds("new9")


def test_ledger_folds_in_arrival_order_whatever_the_stamps_say() -> None:
    ledger = Ledger(max_nodes=1)
    g = groups()
    assert ledger.apply(events.DevicesEvent(node="n", ts=T0 + timedelta(days=365), groups=()))
    assert ledger.apply(events.DevicesEvent(node="n", ts=T0, groups=g))  # later: it wins
    assert not ledger.apply(events.DevicesEvent(node="n", ts=T0 - timedelta(1), groups=g))
    state = ledger.get("n")
    assert state is not None and state.groups == g
    with pytest.raises(Refused) as refused:
        ledger.apply(events.DevicesEvent(node="other", ts=T0))
    assert refused.value.reason == "too_many_nodes"


def test_allocations_charge_units() -> None:
    g = groups("controlplane_detect_amd_x2.json")
    a0, a1 = g[0].accelerators[0], g[0].accelerators[1]
    allocs = {
        "p1/c": events.AllocationEvent(node="n", allocation_id="p1/c", action="allocated",
                                       resource="amd.com/gpu", device_ids=(f"{g[0].id}:{a0.id}:0000",)),
        "p2/c": events.AllocationEvent(node="n", allocation_id="p2/c", action="allocated",
                                       resource="amd.com/gpu.shared",
                                       device_ids=(f"{g[0].id}:{a1.id}:0000", "x:GPU-nope:0")),
    }  # fmt: skip
    status = allocating.devices_status(g, allocs)
    cards = status.body["groups"][0]["accelerators"]
    assert cards[0]["mode"] == "Exclusive" and cards[0]["remaining"] == 0
    assert cards[1]["mode"] == "Shared" and cards[1]["allocated"] == 160_000
    assert status.unknown_tokens == 1


def test_labels_and_capacity() -> None:
    g = groups()
    labels = labeling.labels(g)
    assert labels["acceleratable.feature.gpustack.ai/nvidia"] == "true"
    assert labels["acceleratable.feature.gpustack.ai/nvidia-h100-80gb-hbm3.count"] == "8"
    cap = labeling.capacity(g)
    assert any(k.startswith("nvidia.com/gpu.partitioned.mig-") for k in cap)
    assert all(labeling.is_owned_capacity(k) for k in cap)
    assert not labeling.is_owned_capacity("nvidia.com/gpu") and not labeling.is_owned_label("a/b")


def test_plan_writes_only_on_change() -> None:
    ref = Ref(resource=DEVICES, name="n")
    desired = Desired(spec={"groups": [1]}, status={"x": 1}, whole=WHOLE)
    first = plan(ref, desired, None)
    assert isinstance(first[0], Create) and isinstance(first[1], Patch)
    same = Observed(body={"metadata": {}, "spec": {"groups": [1]}, "status": {"x": 1}},
                    resource_version="1")  # fmt: skip
    assert plan(ref, desired, same) == []
    changed = plan(ref, Desired(spec={"groups": [2]}, status={"x": 1}, whole=WHOLE), same)
    assert changed == [Patch(ref=ref, body={"spec": {"groups": [2]}})]
    assert plan(ref, None, same) == [Delete(ref=ref)]
    assert merge_patch({"a": 1, "b": {"c": 1, "d": 2}}, {"b": {"c": 1}}, whole=True) == {
        "a": None, "b": {"d": None},
    }  # fmt: skip


def test_one_rule_leaves_unnamed_keys_alone_unless_the_part_is_owned_whole() -> None:
    """Named keys are set, ``None`` removes, dicts merge, lists replace; an unnamed key (a server
    default, another writer's) stays, except in a part declared owned whole."""
    current = {"a": 1, "b": {"c": 2, "defaulted": "x"}, "gone": 3, "list": [1, 2]}
    assert merge_patch(current, {"a": 1, "b": {"c": 2}, "list": [1, 2]}) == {}
    assert merge_patch(current, {"b": {"c": 5}, "gone": None, "list": [1]}) == {
        "b": {"c": 5}, "gone": None, "list": [1],
    }  # fmt: skip
    assert merge_patch(current, {"absent": None}) == {}
    assert merge_patch(current, {"new": {"x": None, "y": 1}}) == {"new": {"y": 1}}
    assert merge_patch(current, {"absent": None, "a": 1}, whole=True) == {
        "b": None, "gone": None, "list": None,
    }  # fmt: skip


def test_plan_applies_the_rule_per_part_and_never_owns_metadata_whole() -> None:
    ref = Ref(resource=DEVICES, name="n")
    body = {
        "metadata": {"labels": {"theirs": "1", "ours": "a"}, "resourceVersion": "3"},
        "spec": {"queueingStrategy": "BestEffortFIFO", "x": 1},
        "status": {"downloading": "50%", "x": 1},
    }
    seen = Observed.of(body)
    named = Desired(metadata={"labels": {"ours": "a"}}, spec={"x": 1}, status={"x": 1})
    assert plan(ref, named, seen) == []  # a defaulted spec key and a stale status key stay
    # Another writer's label and a None for a key already absent write nothing, whole or not
    # (the old planning patched both again on every pass).
    theirs = Desired(
        metadata={"labels": {"ours": "a"}}, spec={**body["spec"], "y": None}, whole=WHOLE
    )
    assert plan(ref, msgspec.structs.replace(theirs, status={"downloading": "50%", "x": 1}),
                seen) == []  # fmt: skip
    owned = msgspec.structs.replace(named, whole=frozenset({"status"}))
    assert plan(ref, owned, seen) == [
        Patch(ref=ref, body={"status": {"downloading": None}}, subresource="status")
    ]
    relabel = Desired(metadata={"labels": {"ours": "b"}}, whole=WHOLE)
    assert plan(ref, relabel, seen) == [
        Patch(ref=ref, body={"metadata": {"labels": {"ours": "b"}}})
    ]
    (create, status) = plan(ref, Desired(spec={"y": None, "z": 1}, status={}), None)
    assert create.body["spec"] == {"z": 1} and status.body == {"status": {}}


def test_lease_decisions() -> None:
    now = T0
    fresh = {
        "spec": {"holderIdentity": "a", "renewTime": now.isoformat(), "leaseDurationSeconds": 15}
    }
    assert leading.decide(None, "b", now) == "create"
    assert leading.decide(fresh, "a", now) == "renew"
    assert leading.decide(fresh, "b", now) == "follow"
    assert leading.decide(fresh, "b", now + timedelta(seconds=16)) == "take"
    assert leading.decide({"spec": {"holderIdentity": None}}, "b", now) == "take"


def test_token_bucket() -> None:
    t = [0.0]
    bucket = TokenBucket(10, 2, clock=lambda: t[0])
    assert bucket.reserve() == 0 and bucket.reserve() == 0
    assert abs(bucket.reserve() - 0.1) < 1e-9
    t[0] = 10.0
    assert bucket.reserve() == 0


def test_fixture_is_dm_detect_output() -> None:
    assert json.loads((HERE / "controlplane_detect_h100x8_mig.json").read_text())[0]["simulated"]


def test_a_restated_spec_is_unchanged_by_identity_and_by_value() -> None:
    """The ledger keeps a canonical spec as received, so a recalled restatement (the same
    tuple) is unchanged at once; an equal copy, or the same spec out of order, is unchanged
    too; a different one is a change."""
    ledger = Ledger(max_nodes=1)
    g = groups()
    assert ledger.apply(events.DevicesEvent(node="n", ts=T0, groups=g))
    state = ledger.get("n")
    assert state is not None and state.groups is g
    assert not ledger.apply(events.DevicesEvent(node="n", ts=T0, groups=g))
    copy = msgspec.json.decode(msgspec.json.encode(g), type=tuple[DeviceGroup, ...])
    assert not ledger.apply(events.DevicesEvent(node="n", ts=T0, groups=copy))
    shuffled = tuple(
        msgspec.structs.replace(x, accelerators=tuple(reversed(x.accelerators))) for x in g
    )
    assert not ledger.apply(events.DevicesEvent(node="n", ts=T0, groups=shuffled))
    assert state.groups == g
    assert ledger.apply(events.DevicesEvent(node="n", ts=T0, groups=()))
    assert ledger.apply(events.DevicesEvent(node="n", ts=T0, groups=g))

"""The gateway's pure answers: cluster tags, flavors grouped by spec, InstanceTypes by shape."""

from __future__ import annotations

from typing import Any

from controlplane.gateway import aggregation as agg
from controlplane.gateway import kinds


def it(name: str, group: str, once: int, remaining: int, **spec: Any) -> dict[str, Any]:
    body = {"acceleratorGroup": group, "generalGroup": "generic", "os": "linux", "arch": "amd64",
            "unit": 1600000, **spec}  # fmt: skip
    views = {"accelerator": {"onceMaxRequest": once, "remaining": remaining, "capacity": 8},
             "acceleratorShared": {"onceMaxRequest": 1, "remaining": 10, "capacity": 80}}  # fmt: skip
    return {"metadata": {"name": name}, "spec": body, "status": views}


def test_tagged_adds_the_cluster_to_each_object_in_cluster_order() -> None:
    out = agg.tagged({"2": [{"metadata": {"name": "b"}}], "1": [{"metadata": {"name": "a"}}]})
    assert out == {"items": [{"metadata": {"name": "a"}, "cluster": "1"},
                             {"metadata": {"name": "b"}, "cluster": "2"}]}  # fmt: skip


def test_instance_types_fold_by_shape_with_tiers_largest_first() -> None:
    held = {
        "east": [it("t", "nvidia-h200", 8, 12)],
        "west": [it("t", "nvidia-h200", 4, 3, displayName="West H200")],
        "north": [it("t", "nvidia-h200", 8, 4)],
    }
    [item] = agg.aggregate_instance_types(held)["items"]
    assert item["name"] == "generic-nvidia-h200-linux-amd64"
    assert item["spec"]["acceleratable"] is True and "displayName" not in item["spec"]
    status = item["status"]
    assert status["onceMaxRequest"]["accelerator"] == "8"
    assert status["remaining"] == {"accelerator": "19", "acceleratorShared": "30",
                                   "acceleratorSliced": "0"}  # fmt: skip
    tiers = status["tiers"]
    assert [t["onceMaxRequest"]["accelerator"] for t in tiers] == ["8", "4"]
    assert [c["cluster"] for c in tiers[0]["candidates"]] == ["east", "north"]
    assert tiers[0]["remaining"]["accelerator"] == "16"
    assert tiers[0]["candidates"][0] == {
        "cluster": "east", "name": "t", "phase": "Active",
        "accelerator": {"onceMaxRequest": "8", "remaining": "12", "capacity": "8"},
        "acceleratorShared": {"onceMaxRequest": "1", "remaining": "10", "capacity": "80"},
        "acceleratorSliced": {"onceMaxRequest": "0", "remaining": "0", "capacity": "0"},
    }  # fmt: skip


def test_only_active_candidates_count() -> None:
    held = {"east": [it("t", "nvidia-h200", 8, 12, inactive=True)],
            "west": [it("t", "nvidia-h200", 2, 2)]}  # fmt: skip
    [item] = agg.aggregate_instance_types(held)["items"]
    assert item["status"]["onceMaxRequest"]["accelerator"] == "2"
    assert [c["cluster"] for t in item["status"]["tiers"] for c in t["candidates"]] == ["west"]


def test_cpu_types_and_distinct_shapes_get_distinct_names() -> None:
    held = {"a": [it("cpu", "", 0, 0), it("x", "nvidia-h200", 1, 1, memory=1)],
            "b": [it("x", "nvidia-h200", 1, 1, memory=2)]}  # fmt: skip
    out = agg.aggregate_instance_types(held)["items"]
    names = [i["name"] for i in out]
    assert names[0] == "generic-linux-amd64" and out[0]["spec"]["acceleratable"] is False
    assert names[1] == "generic-nvidia-h200-linux-amd64"
    assert names[2].startswith("generic-nvidia-h200-linux-amd64-") and len(set(names)) == 3
    assert agg.aggregate_instance_types(held) == agg.aggregate_instance_types(
        dict(reversed(held.items()))
    )


def test_flavors_group_by_whole_spec_accelerated_first() -> None:
    gpu = {"acceleratable": True, "acceleratorGroup": "nvidia-h200", "count": 8}
    held = {
        "2": [{"metadata": {"name": "z-gpu"}, "spec": gpu}],
        "1": [{"metadata": {"name": "a-gpu"}, "spec": gpu},
              {"metadata": {"name": "a-cpu"}, "spec": {"acceleratable": False, "count": 64}}],
    }  # fmt: skip
    assert agg.aggregate_flavors(held) == {"items": [
        {"name": "a-gpu", "spec": {**gpu, "clusters": ["1", "2"]}},
        {"name": "a-cpu", "spec": {"acceleratable": False, "count": 64, "clusters": ["1"]}},
    ]}  # fmt: skip


def test_changes_are_watch_events_by_name() -> None:
    old = {"a": {"v": 1}, "b": {"v": 1}}
    new = {"b": {"v": 2}, "c": {"v": 1}}
    assert agg.changes(old, new) == [("DELETED", {"v": 1}), ("MODIFIED", {"v": 2}),
                                     ("ADDED", {"v": 1})]  # fmt: skip


def test_readiness_needs_available_true_and_backoff_caps() -> None:
    ok = {"status": {"conditions": [{"type": "Available", "status": "True"}]}}
    no = {"status": {"conditions": [{"type": "Available", "status": "False",
                                     "message": "endpoints missing"}]}}  # fmt: skip
    assert kinds.not_ready_reason("v1.gpustack.ai", ok) is None
    assert "endpoints missing" in (kinds.not_ready_reason("v1.gpustack.ai", no) or "")
    assert "no Available" in (kinds.not_ready_reason("v1.gpustack.ai", {}) or "")
    steps = kinds.backoff(5.0, 60.0)
    assert [next(steps) for _ in range(6)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    assert kinds.parse_gvk("v1/Pod") == ("", "v1", "Pod")
    assert (
        kinds.served(kinds.parse_gvk("worker.gpustack.ai/v1/Instance")) is kinds.KINDS["Instance"]
    )


def test_partitions_are_listed_per_profile_never_summed_into_one_number() -> None:
    def mig(name: str, once: int, remaining: list[tuple[str, int]], held: int) -> dict[str, Any]:
        obj = it(name, "nvidia-h100", 1, 1)
        obj["status"]["acceleratorPartitioned"] = {
            "onceMaxRequest": once, "remaining": sum(c for _, c in remaining), "capacity": 14,
            "allocatedProfiles": [{"name": "1g.10gb", "count": held}, {"name": "3g.40gb", "count": 0}],
            "remainingProfiles": [{"name": n, "count": c} for n, c in remaining],
        }  # fmt: skip
        return obj

    held = {"a": [mig("t", 1, [("1g.10gb", 3), ("3g.40gb", 0)], 4)],
            "b": [mig("t", 1, [("1g.10gb", 7), ("3g.40gb", 2)], 0)]}  # fmt: skip
    [item] = agg.aggregate_instance_types(held)["items"]
    status = item["status"]
    assert status["remaining"]["acceleratorPartitioned"] == [
        {"name": "1g.10gb", "count": 10}, {"name": "3g.40gb", "count": 2}]  # fmt: skip
    # The first best candidate's profiles, each capped at one: a partition request is one instance.
    assert status["onceMaxRequest"]["acceleratorPartitioned"] == [
        {"name": "1g.10gb", "count": 1}, {"name": "3g.40gb", "count": 0}]  # fmt: skip
    first = status["tiers"][0]["candidates"][0]["acceleratorPartitioned"]
    assert first["allocatedProfiles"] == [{"name": "1g.10gb", "count": 4}]  # zeros left out
    assert first["remaining"] == "3" and first["capacity"] == "14"
    # Types without a ledger carry none.
    [plain] = agg.aggregate_instance_types({"a": [it("t", "nvidia-h200", 1, 1)]})["items"]
    assert "acceleratorPartitioned" not in plain["status"]["remaining"]

"""The scheduling chain's pure decisions: names, InstanceType views, Kueue objects, fit, the check."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from bus import events
from bus.devices import Accelerator, DeviceGroup
from controlplane.admission.requests import Family
from controlplane.chain import fit, kueue, naming, views
from controlplane.chain.inventory import NodeFacts, facts_of, general_key
from controlplane.chain.settings import ChainSettings
from controlplane.reconciling.nodestates import NodeState

HERE = Path(__file__).parents[1]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
M = 1_600_000


def groups(name: str) -> tuple[DeviceGroup, ...]:
    return msgspec.json.decode((HERE / name).read_bytes(), type=tuple[DeviceGroup, ...])


H200 = groups("controlplane_detect_h200x8.json")
AMD = groups("controlplane_detect_amd_x2.json")
MIG = groups("controlplane_detect_h100x8_mig.json")


def node_obj(name: str, cpu: str = "96", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux",
                                              "kubernetes.io/arch": "amd64", **labels}},
        "status": {"capacity": {"cpu": cpu}, "allocatable": {"cpu": cpu}},
    }  # fmt: skip


def alloc(
    node: str, aid: str, resource: str, group: DeviceGroup, *cards: int
) -> events.AllocationEvent:
    ids = tuple(f"{group.id}:{group.accelerators[c].id}:{i:04d}" for i, c in enumerate(cards))
    return events.AllocationEvent(
        node=node, ts=T0, allocation_id=aid, action="allocated", resource=resource, device_ids=ids
    )


def facts(
    name: str, gs: tuple[DeviceGroup, ...], *allocs: events.AllocationEvent, cpu: str = "96"
) -> NodeFacts:
    state = NodeState(groups=gs, allocations={a.allocation_id: a for a in allocs})
    return facts_of(node_obj(name, cpu), state)


def test_names_follow_the_reference_shapes() -> None:
    assert naming.fnv64a("") == 0xCBF29CE484222325 and naming.fnv64a("a") == 0xAF63DC4C8601EC8C
    lq = naming.local_queue("gpustack--nvidia-h200-linux-amd64")
    assert lq.startswith("gpustack-fnv64-") and len(lq) == 31
    assert (
        naming.cluster_queue("nvidia-h200", "linux", "amd64") == "gpustack--nvidia-h200-linux-amd64"
    )
    assert naming.cluster_queue(None, "linux", "arm64") == "gpustack--generic-linux-arm64"
    assert naming.flavor("generic", "nvidia-h200", "linux", "amd64", 8, "default") == (
        "gpustack--generic--nvidia-h200-linux-amd64-8d"
    )
    assert naming.flavor("amd-epyc-7763", None, "linux", "amd64", 96, "rack") == (
        "gpustack--amd-epyc-7763-linux-amd64-96c-prack"
    )
    assert [naming.quantity(v) for v in (0, 96, 1000, 12_800_000, 3_200_000, 1_600_001)] == [
        "0", "96", "1k", "12800k", "3200k", "1600001",
    ]  # fmt: skip
    assert naming.card_credits(2) == "3200k"


def test_general_key_from_cpu_facts() -> None:
    labels = {"feature.node.kubernetes.io/cpu-model.vendor_id": "AuthenticAMD"}
    assert general_key(labels, {"feature.gpustack.ai/cpu-name": "AMD EPYC 7763"}) == "amd-epyc-7763"
    assert general_key({}, {"feature.gpustack.ai/cpu-name": "@unknown"}) == "generic"
    assert general_key({}, {}) == "generic"


def test_four_views_of_an_idle_h200_node() -> None:
    n = facts("n1", H200)
    status = views.instance_type_status("nvidia-h200", [n], {}, "lq")
    assert status["accelerator"] == {"onceMaxRequest": 8, "remaining": 8, "capacity": 8}
    assert status["acceleratorShared"] == {"onceMaxRequest": 8, "remaining": 80, "capacity": 80}
    assert status["acceleratorSliced"] == {"onceMaxRequest": 100, "remaining": 800, "capacity": 800}
    part = status["acceleratorPartitioned"]
    assert (part["capacity"], part["remaining"], part["onceMaxRequest"]) == (0, 0, 0)
    assert part["allocatedProfiles"] == [] and part["remainingProfiles"] == []
    assert status["entrance"] == "lq"
    assert status["detail"]["slicedDetail"]["logicalSlices"] == 128


def test_views_follow_allocations_per_family() -> None:
    g = H200[0]
    n = facts(
        "n1", H200,
        alloc("n1", "a", "nvidia.com/gpu", g, 0, 1),  # two whole cards
        alloc("n1", "b", "nvidia.com/gpu.shared", g, 2, 3),  # a share on cards 2 and 3
        alloc("n1", "c", "nvidia.com/gpu.sliced", g, 4),  # one slice on card 4
    )  # fmt: skip
    status = views.instance_type_status("nvidia-h200", [n], {}, "lq")
    assert status["accelerator"] == {"onceMaxRequest": 3, "remaining": 3, "capacity": 8}
    # cards 2, 3 hold 9 shares each; cards 4..7 are free or sliced (4 is sliced: no shares)
    assert status["acceleratorShared"]["remaining"] == 9 + 9 + 3 * 10
    assert status["acceleratorShared"]["onceMaxRequest"] == 5
    sliced = status["acceleratorSliced"]
    slice_units = M // 128  # this ledger charges one slot's units per sliced token
    assert sliced["remaining"] == (M - slice_units) // 16_000 + 3 * 100
    assert sliced["onceMaxRequest"] == 100


def test_partitioned_view_lists_every_profile_even_at_zero() -> None:
    g = MIG[0]
    idle = views.instance_type_status(g.id, [facts("m", MIG)], {}, "lq")["acceleratorPartitioned"]
    names = [p["name"] for p in idle["remainingProfiles"]]
    assert names[0] == "1g.10gb" and "7g.80gb" in names
    assert all(p["count"] == 0 for p in idle["allocatedProfiles"])
    # the fixture has MIG on cards 0-3 (7 tokens each) and logical slicing on cards 4-7
    assert idle["capacity"] == 4 * 7 and idle["remaining"] == 4 * 7 and idle["onceMaxRequest"] == 1
    one = {p["name"]: p["count"] for p in idle["remainingProfiles"]}
    assert one["1g.10gb"] == 4 * 7 and one["7g.80gb"] == 4
    a = alloc("m", "p", "nvidia.com/gpu.partitioned", g, 0, 0, 0)  # 3 tokens: a 3g instance
    busy_node = facts("m", MIG, a)
    busy = views.instance_type_status(g.id, [busy_node], {"m": [a]}, "lq")["acceleratorPartitioned"]
    allocated = {p["name"]: p["count"] for p in busy["allocatedProfiles"]}
    assert allocated["3g.40gb"] == 1 and sum(allocated.values()) == 1
    remaining = {p["name"]: p["count"] for p in busy["remainingProfiles"]}
    assert remaining["7g.80gb"] == 3 and remaining["1g.10gb"] == 3 * 7 + 4  # card 0: 4 slices left


def _lying_mig(g: DeviceGroup) -> DeviceGroup:
    """``g`` as a node lying inside the bounds: 1 MiB cards whose every profile is one slice,
    4,096 of them a card."""

    def card(a: Accelerator) -> Accelerator:
        physical = a.status.physical_sliced
        if physical is None:
            return a
        profiles = tuple(
            msgspec.structs.replace(p, compute_slices=1, memory_mib=1, count=4096)
            for p in physical.profiles
        )
        lie = msgspec.structs.replace(physical, profiles=profiles, count=4096)
        return msgspec.structs.replace(
            a, status=msgspec.structs.replace(a.status, physical_sliced=lie)
        )

    return msgspec.structs.replace(g, memory=1, accelerators=tuple(map(card, g.accelerators)))


def test_a_lying_node_does_not_change_what_other_nodes_count_for() -> None:
    """The views of honest nodes with a liar among them are the honest nodes' views plus the
    liar's own: its profiles, slices and partition count size no other node's cards, and the
    catalog is what most nodes describe."""
    g = MIG[0]
    liar = facts("liar", tuple(map(_lying_mig, MIG)))
    a_alloc = alloc("a", "p", "nvidia.com/gpu.partitioned", g, 0, 0, 0)  # a 3g instance on a
    honest = [facts("a", MIG, a_alloc), facts("b", MIG)]
    allocs = {"a": [a_alloc]}

    def counts(nodes: list[NodeFacts], side: str) -> Counter[str]:
        part = views.instance_type_status(g.id, nodes, allocs, "lq")["acceleratorPartitioned"]
        return Counter({p["name"]: p["count"] for p in part[side]})

    for side in ("remainingProfiles", "allocatedProfiles"):
        assert counts([liar, *honest], side) == counts([liar], side) + counts(honest, side)
    assert counts(honest, "allocatedProfiles") == Counter({"3g.40gb": 1})
    detail = views.instance_type_status(g.id, [liar, *honest], allocs, "lq")["detail"]
    assert detail["slicedDetail"]["memoryMib"] == g.memory == 81559
    plan = chain([liar, *honest])  # the liar sorts first: it used to describe the type
    types = [t.spec for name, t in plan.instance_types.items() if g.id in name]
    flavors = [c.spec for c in plan.catalog.values() if c.spec and c.spec.get("memory")]
    assert [t and t["memory"] for t in types] == [81559]
    assert flavors and all(f["memory"] == 81559 for f in flavors)


def test_profile_of_tokens_is_the_smallest_covering_profile() -> None:
    profiles = MIG[0].accelerators[0].status.physical_sliced.profiles  # type: ignore[union-attr]
    assert [views.profile_of_tokens(profiles, k, 7) for k in (1, 2, 3, 4, 5, 7)] == [
        "1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "7g.80gb",
    ]  # fmt: skip


def chain(nodes: list[NodeFacts], **over: Any) -> kueue.ChainPlan:
    kw: dict[str, Any] = {
        "allocations": {}, "namespaces": ["default", "team-a", "kube-system", "gpustack-system"],
        "instance_types": {}, "cluster_queues": {},
        "active_checks": [naming.CHECK_NODE_DEVICES], "settings": ChainSettings(),
    }  # fmt: skip
    kw.update(over)
    return kueue.plan_chain(nodes, **kw)


def by_kind(plan: kueue.ChainPlan, kind: str) -> dict[str, Any]:
    return {
        (f"{r.namespace}/" if r.namespace else "") + r.name: d
        for r, d in plan.kueue.items()
        if r.resource.kind == kind
    }


def test_two_nodes_make_the_reference_objects() -> None:
    plan = chain([facts("h", H200), facts("r", AMD, cpu="16")])
    h200, rx = "gpustack--nvidia-h200-linux-amd64", "gpustack--amd-radeon-rx-7800-xt-linux-amd64"
    cpu = "gpustack--generic-linux-amd64"
    assert set(plan.instance_types) == {h200, rx, cpu}
    it = plan.instance_types[h200]
    assert it.spec is not None and it.spec["acceleratorGroup"] == "nvidia-h200"
    assert it.metadata["labels"][naming.ENTRANCE] == naming.local_queue(h200)
    flavors = by_kind(plan, "ResourceFlavor")
    assert set(flavors) == {
        "gpustack--generic--nvidia-h200-linux-amd64-8d",
        "gpustack--generic--amd-radeon-rx-7800-xt-linux-amd64-2d",
        "gpustack--generic-linux-amd64-96c", "gpustack--generic-linux-amd64-16c",
    }  # fmt: skip
    f = flavors["gpustack--generic--nvidia-h200-linux-amd64-8d"].spec
    assert f["nodeLabels"]["acceleratable.feature.gpustack.ai/nvidia-h200"] == "true"
    assert f["nodeLabels"]["acceleratable.feature.gpustack.ai/nvidia-h200.count"] == "8"
    assert f["tolerations"] == [{"operator": "Exists"}] and f["topologyName"] == "gpustack--default"
    queues = by_kind(plan, "ClusterQueue")
    q = queues[h200].spec
    assert q["resourceGroups"] == [{
        "coveredResources": ["credits.gpustack.ai/nvidia"],
        "flavors": [{"name": "gpustack--generic--nvidia-h200-linux-amd64-8d",
                     "resources": [{"name": "credits.gpustack.ai/nvidia", "nominalQuota": "12800k"}]}],
    }]  # fmt: skip
    assert queues[rx].spec["resourceGroups"][0]["flavors"][0]["resources"][0] == {
        "name": "credits.gpustack.ai/amd",
        "nominalQuota": "3200k",
    }
    cpu_q = queues[cpu].spec["resourceGroups"][0]
    assert cpu_q["coveredResources"] == ["cpu"]
    assert [f["name"] for f in cpu_q["flavors"]] == [  # smallest per-node count first
        "gpustack--generic-linux-amd64-16c", "gpustack--generic-linux-amd64-96c",
    ]  # fmt: skip
    assert q["stopPolicy"] == "None" and "cohortName" not in q
    assert q["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": naming.CHECK_NODE_DEVICES}]
    }
    assert queues[cpu].spec["admissionChecksStrategy"] is None  # joint check never Active here
    locals_ = by_kind(plan, "LocalQueue")
    assert len(locals_) == 2 * 3  # default and team-a; no kube-* or system namespace
    lq = locals_[f"team-a/{naming.local_queue(h200)}"]
    assert lq.spec == {"clusterQueue": h200, "stopPolicy": "None"}
    assert lq.metadata["annotations"] == {naming.QUEUE_ANNOTATION: h200}
    assert set(by_kind(plan, "AdmissionCheck")) == {naming.CHECK_NODE_DEVICES, naming.CHECK_JOINT}
    assert set(by_kind(plan, "Topology")) == {"gpustack--default"}
    assert plan.entrances[naming.local_queue(h200)] == "nvidia-h200"
    assert plan.statuses[h200]["accelerator"]["capacity"] == 8
    assert plan.statuses[rx]["acceleratorSliced"]["capacity"] == 200
    assert set(plan.catalog) == set(flavors)
    # creation order: a reference never dangles
    kinds = [r.resource.kind for r in plan.kueue]
    assert kinds.index("Topology") < kinds.index("ResourceFlavor") < kinds.index("ClusterQueue")
    assert kinds.index("ClusterQueue") < kinds.index("LocalQueue")


def test_queue_holds_until_filled_drains_when_emptied_and_mirrors_inactive() -> None:
    assert kueue.stop_policy(None, False, False) == ("Hold", True)
    held = {"metadata": {"annotations": {naming.EMPTY_PLAN_HOLD: "true"}}}
    assert kueue.stop_policy(held, False, False) == ("Hold", True)
    assert kueue.stop_policy({"metadata": {}}, False, False) == ("HoldAndDrain", False)
    assert kueue.stop_policy(held, True, False) == ("None", False)
    assert kueue.stop_policy({}, True, True) == ("Hold", False)
    h200 = "gpustack--nvidia-h200-linux-amd64"
    existing = chain([facts("h", H200)]).instance_types[h200]
    it = {"metadata": {"name": h200}, "spec": {**(existing.spec or {}), "inactive": True}}
    plan = chain([facts("h", H200)], instance_types={h200: it})
    assert h200 not in plan.instance_types  # create-only: never rewritten
    assert by_kind(plan, "ClusterQueue")[h200].spec["stopPolicy"] == "Hold"
    gone = chain([], instance_types={h200: it}, cluster_queues={h200: {"metadata": {}}})
    q = by_kind(gone, "ClusterQueue")[h200]
    assert q.spec["stopPolicy"] == "HoldAndDrain" and q.spec["resourceGroups"] == []
    assert not by_kind(gone, "ResourceFlavor")


def test_manage_kueue_off_plans_no_kueue_object() -> None:
    plan = chain([facts("h", H200)], settings=ChainSettings(manage_kueue=False))
    assert plan.kueue == {} and plan.instance_types and plan.statuses


def test_fit_labels_follow_the_ledger() -> None:
    g = AMD[0]
    idle = fit.fit_labels(facts("r", AMD))
    assert idle == {
        "sliced-max-free-units.fit.gpustack.ai/amd-radeon-rx-7800-xt": str(M),
        "shared-free-cards.fit.gpustack.ai/amd-radeon-rx-7800-xt": "2",
    }
    busy = fit.fit_labels(facts("r", AMD, alloc("r", "x", "amd.com/gpu", g, 0),
                                alloc("r", "y", "amd.com/gpu.sliced", g, 1)))  # fmt: skip
    assert busy["sliced-max-free-units.fit.gpustack.ai/amd-radeon-rx-7800-xt"] == str(M - M // 128)
    assert busy["shared-free-cards.fit.gpustack.ai/amd-radeon-rx-7800-xt"] == "0"


def spec_of(**limits: str) -> dict[str, Any]:
    return {"containers": [{"name": "c", "resources": {"limits": limits}}]}


def test_demands_per_family() -> None:
    assert fit.demands_of(spec_of(**{"nvidia.com/gpu": "2"})) == [fit.Demand(Family.EXCLUSIVE, 2)]
    assert fit.demands_of(spec_of(**{"nvidia.com/gpu.shared": "3"})) == [
        fit.Demand(Family.SHARED, 3)
    ]
    sliced = spec_of(**{"nvidia.com/gpu.sliced": "1", "nvidia.com/gpu.sliced.units": "800k"})
    assert fit.demands_of(sliced) == [fit.Demand(Family.SLICED, 800_000)]
    pct = spec_of(**{"amd.com/gpu.sliced": "1", "amd.com/gpu.sliced.memory-percentage": "25"})
    assert fit.demands_of(pct) == [fit.Demand(Family.SLICED, 400_000)]
    part = spec_of(
        **{"nvidia.com/gpu.partitioned": "1", "nvidia.com/gpu.partitioned.units": "400k"}
    )
    assert fit.demands_of(part) == [fit.Demand(Family.PARTITIONED, 400_000)]
    assert fit.demands_of(spec_of(cpu="2")) == []


def test_check_answers_ready_or_retry_per_family() -> None:
    g = AMD[0]
    cards = {"r": list(facts("r", AMD, alloc("r", "x", "amd.com/gpu", g, 0)).cards)}
    cases = [
        (fit.Demand(Family.EXCLUSIVE, 1), fit.Demand(Family.EXCLUSIVE, 2)),
        (fit.Demand(Family.SHARED, 1), fit.Demand(Family.SHARED, 2)),
        (fit.Demand(Family.SLICED, M), fit.Demand(Family.SLICED, M + 1)),
    ]
    for fits, too_big in cases:
        assert fit.decide(cards, [("main", [fits], [("r", 1)])]).state == "Ready"
        verdict = fit.decide(cards, [("main", [too_big], [("r", 1)])])
        assert verdict.state == "Retry" and "does not fit node r" in verdict.message
    # two pods of half a card each fit one free card; three do not
    half = [fit.Demand(Family.SLICED, M // 2)]
    assert fit.decide(cards, [("main", half, [("r", 2)])]).state == "Ready"
    assert fit.decide(cards, [("main", half, [("r", 3)])]).state == "Retry"
    # an in-flight admitted workload takes the free card first
    busy = fit.decide(cards, [("main", [fit.Demand(Family.EXCLUSIVE, 1)], [("r", 1)])],
                      in_flight=[([fit.Demand(Family.EXCLUSIVE, 1)], [("r", 1)])])  # fmt: skip
    assert busy.state == "Retry"
    assert fit.decide(cards, [("main", half, [("gone", 1)])]).state == "Retry"
    mig = {"m": list(facts("m", MIG).cards)}
    assert (
        fit.decide(mig, [("p", [fit.Demand(Family.PARTITIONED, M)], [("m", 4)])]).state == "Ready"
    )
    assert (
        fit.decide(mig, [("p", [fit.Demand(Family.PARTITIONED, M)], [("m", 5)])]).state == "Retry"
    )


def test_pin_adds_fit_requirements_to_every_term() -> None:
    from controlplane.chain.workloads import pin

    spec = spec_of(**{"nvidia.com/gpu.sliced": "1", "nvidia.com/gpu.sliced.units": "800k"})
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                              {"matchExpressions": [{"key": "b", "operator": "Exists"}]}]}}}  # fmt: skip
    wl = {"spec": {"podSets": [{"name": "main", "template": {"spec": spec}}]}}
    (op,) = pin(wl, "nvidia-h200")
    terms = op.value["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    want = {"key": "sliced-max-free-units.fit.gpustack.ai/nvidia-h200", "operator": "Gt",
            "values": ["799999"]}  # fmt: skip
    assert [t["matchExpressions"][-1] for t in terms["nodeSelectorTerms"]] == [want, want]
    assert [t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]] == ["a", "b"]
    # pinned already: nothing to add; exclusive requests are not pinned
    spec["affinity"] = op.value
    assert pin(wl, "nvidia-h200") == []
    shared = {"spec": {"podSets": [{"template": {"spec": spec_of(**{"amd.com/gpu.shared": "2"})}}]}}
    (op,) = pin(shared, "amd-radeon-rx-7800-xt")
    term = op.value["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"] == [{"matchExpressions": [{
        "key": "shared-free-cards.fit.gpustack.ai/amd-radeon-rx-7800-xt", "operator": "Gt",
        "values": ["1"]}]}]  # fmt: skip
    assert (
        pin(
            {"spec": {"podSets": [{"template": {"spec": spec_of(**{"nvidia.com/gpu": "1"})}}]}}, "g"
        )
        == []
    )


def test_check_assignments_from_topology_or_the_flavor() -> None:
    from controlplane.chain import checking

    wl: dict[str, Any] = {
        "spec": {"podSets": [{"name": "main", "count": 2, "template": {"spec": spec_of(**{"amd.com/gpu": "1"})}}]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admissionChecks": [{"name": naming.CHECK_NODE_DEVICES, "state": "Pending"}],
            "admission": {"podSetAssignments": [{"name": "main", "count": 2, "flavors": {"credits.gpustack.ai/amd": "f"}}]},
        },
    }  # fmt: skip
    assert checking.pending_check(wl)
    ((name, demands, where),) = checking.assignments(wl, {"f": ["r1", "r2"]})
    assert (name, demands, where) == (
        "main",
        [fit.Demand(Family.EXCLUSIVE, 1)],
        [(("r1", "r2"), 2)],
    )
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = {
        "levels": ["kubernetes.io/hostname"], "domains": [{"values": ["r1"], "count": 2}],
    }  # fmt: skip
    assert checking.assignments(wl, {})[0][2] == [("r1", 2)]
    wl["status"]["conditions"].append({"type": "Evicted", "status": "True"})
    assert not checking.pending_check(wl)  # evicted workloads are skipped


def test_mixed_on_node_off_keeps_cpu_work_off_accelerated_nodes() -> None:
    """``instance-type-mixed-on-node=false``: the CPU InstanceType is made of the nodes with no
    accelerator only, its flavors select the ``cpu-only`` label, and the worker sets that label
    on exactly those nodes; on (the default) every node takes CPU work and none is labelled."""
    nodes = [facts("h", H200), facts("c", (), cpu="32")]
    cpu = "gpustack--generic-linux-amd64"
    mixed = chain(nodes)
    assert set(by_kind(mixed, "ResourceFlavor")) >= {
        "gpustack--generic-linux-amd64-96c", "gpustack--generic-linux-amd64-32c",
    }  # fmt: skip
    assert all(kueue.node_labels(n, ChainSettings()) == {} for n in nodes)

    apart = ChainSettings(instance_type_mixed_on_node=False)
    plan = chain(nodes, settings=apart)
    flavors = by_kind(plan, "ResourceFlavor")
    assert "gpustack--generic-linux-amd64-96c" not in flavors  # the H200 node's CPU
    cpu_flavor = flavors["gpustack--generic-linux-amd64-32c"].spec["nodeLabels"]
    assert cpu_flavor[naming.CPU_ONLY] == "true"
    h200_flavor = flavors["gpustack--generic--nvidia-h200-linux-amd64-8d"].spec["nodeLabels"]
    assert naming.CPU_ONLY not in h200_flavor
    q = by_kind(plan, "ClusterQueue")[cpu].spec["resourceGroups"][0]
    assert [f["name"] for f in q["flavors"]] == ["gpustack--generic-linux-amd64-32c"]
    assert kueue.node_labels(nodes[0], apart) == {}
    assert kueue.node_labels(nodes[1], apart) == {naming.CPU_ONLY: "true"}
    # Accelerated nodes only: no CPU InstanceType is derived at all.
    assert cpu not in chain([facts("h", H200)], settings=apart).instance_types


def test_drain_when_no_flavors_off_holds_an_emptied_queue_without_draining() -> None:
    """``instance-type-drain-when-no-flavors=false``: a queue whose flavors are all gone is
    held (``Hold``: what it admitted keeps running) instead of ``HoldAndDrain``."""
    assert kueue.stop_policy({"metadata": {}}, False, False, drain=False) == ("Hold", False)
    assert kueue.stop_policy(None, False, False, drain=False) == ("Hold", True)
    h200 = "gpustack--nvidia-h200-linux-amd64"
    it = {"metadata": {"name": h200}, "spec": chain([facts("h", H200)]).instance_types[h200].spec}
    observed = {h200: {"metadata": {}}}
    drained = chain([], instance_types={h200: it}, cluster_queues=observed)
    assert by_kind(drained, "ClusterQueue")[h200].spec["stopPolicy"] == "HoldAndDrain"
    keep = ChainSettings(instance_type_drain_when_no_flavors=False)
    held = chain([], instance_types={h200: it}, cluster_queues=observed, settings=keep)
    q = by_kind(held, "ClusterQueue")[h200]
    assert q.spec["stopPolicy"] == "Hold" and q.spec["resourceGroups"] == []
    assert q.metadata["annotations"] == {naming.EMPTY_PLAN_HOLD: None}  # not a new queue's hold


def test_aware_cpu_manufacturer_makes_the_general_key_part_of_the_identity() -> None:
    """``instance-type-aware-cpu-manufacturer=true``: nodes with the same cards and different
    CPUs make different InstanceTypes and ClusterQueues, named with the general key first."""
    epyc = msgspec.structs.replace(facts("a", H200), general="amd-epyc-7763")
    xeon = msgspec.structs.replace(facts("b", H200, cpu="64"), general="intel-xeon-8480")
    blind = chain([epyc, xeon])
    assert set(blind.instance_types) == {
        "gpustack--nvidia-h200-linux-amd64", "gpustack--generic-linux-amd64",
    }  # fmt: skip
    aware = ChainSettings(instance_type_aware_cpu_manufacturer=True)
    plan = chain([epyc, xeon], settings=aware)
    names = {
        "gpustack--amd-epyc-7763--nvidia-h200-linux-amd64",
        "gpustack--intel-xeon-8480--nvidia-h200-linux-amd64",
        "gpustack--amd-epyc-7763-linux-amd64", "gpustack--intel-xeon-8480-linux-amd64",
    }  # fmt: skip
    assert set(plan.instance_types) == names == set(by_kind(plan, "ClusterQueue"))
    it = plan.instance_types["gpustack--amd-epyc-7763--nvidia-h200-linux-amd64"].spec
    assert it is not None and it["generalGroup"] == "amd-epyc-7763"
    q = by_kind(plan, "ClusterQueue")["gpustack--intel-xeon-8480--nvidia-h200-linux-amd64"]
    assert [f["name"] for f in q.spec["resourceGroups"][0]["flavors"]] == [
        "gpustack--intel-xeon-8480--nvidia-h200-linux-amd64-8d"
    ]
    status = plan.statuses["gpustack--amd-epyc-7763--nvidia-h200-linux-amd64"]
    assert status["accelerator"]["capacity"] == 8  # its own node's cards, not both nodes'
    # An authored InstanceType keeps its general group as its identity.
    authored = {"metadata": {}, "spec": {**it, "generalGroup": "amd-epyc-7763"}}
    again = chain([epyc], settings=aware, instance_types={"x": authored})
    assert again.statuses["x"]["accelerator"]["capacity"] == 8

"""The chain reconciler's pure parts, without a loop: node labels, a pass's plan, the statuses and
activation it writes, and the wait for Kueue's CRDs."""

from __future__ import annotations

from typing import Any

from test_controlplane_chain_planning import H200, T0, alloc, node_obj

from controlplane.chain import deciding, fit, naming, nodelabels
from controlplane.chain.deciding import KueueWait
from controlplane.chain.inventory import facts_of
from controlplane.chain.kueue import ChainPlan
from controlplane.chain.settings import ChainSettings
from controlplane.reconciling.nodestates import NodeState
from controlplane.reconciling.planning import Desired
from controlplane.resources import Ref

H200_STATE = NodeState(groups=H200, allocations={})


def test_a_new_node_gets_managed_general_profile_and_fit_labels() -> None:
    decided = nodelabels.label_patch(node_obj("n"), H200_STATE, ChainSettings())
    assert decided.facts is not None and decided.facts.name == "n"
    patch = decided.patch
    assert patch[naming.MANAGED] == "true" and patch[naming.PROFILE] == naming.DEFAULT_PROFILE
    assert patch[f"{naming.GENERAL_PREFIX}{decided.facts.general}"] == "true"
    assert {k: v for k, v in patch.items() if fit.is_fit_label(k)} == fit.fit_labels(decided.facts)


def test_a_labelled_node_gets_no_patch_and_a_chosen_profile_is_kept() -> None:
    first = nodelabels.label_patch(node_obj("n", **{naming.PROFILE: "mine"}), H200_STATE,
                                   ChainSettings())  # fmt: skip
    assert naming.PROFILE not in first.patch
    labelled = node_obj("n", **{naming.PROFILE: "mine"}, **first.patch)  # type: ignore[arg-type]
    again = nodelabels.label_patch(labelled, H200_STATE, ChainSettings())
    assert again.patch == {} and again.facts == first.facts


MANUAL = ChainSettings(node_management_manual=True)


def test_manual_management_labels_only_what_the_user_marked() -> None:
    unmarked = nodelabels.label_patch(node_obj("n"), H200_STATE, MANUAL)
    assert unmarked.patch == {} and unmarked.facts is None
    stale = node_obj("n", **{"shared-free-cards.fit.gpustack.ai/old": "3"})
    assert nodelabels.label_patch(stale, H200_STATE, MANUAL).patch == {
        "shared-free-cards.fit.gpustack.ai/old": None
    }  # an owned label of a node no longer managed is removed, others are left alone
    marked = nodelabels.label_patch(node_obj("n", **{naming.MANAGED: "true"}), H200_STATE, MANUAL)
    assert marked.facts is not None and naming.MANAGED not in marked.patch


def test_the_signature_changes_with_labels_ledger_state_and_label_settings_only() -> None:
    body = node_obj("n")
    same = nodelabels.signature(body, H200_STATE, ChainSettings())
    assert nodelabels.signature(node_obj("n"), H200_STATE, ChainSettings()) == same
    assert nodelabels.signature(node_obj("n", extra="1"), H200_STATE, ChainSettings()) != same
    held = alloc("n", "p/c", "nvidia.com/gpu", H200[0], 0)
    busy = NodeState(groups=H200, allocations={"p/c": held})
    assert nodelabels.signature(body, busy, ChainSettings()) != same
    assert nodelabels.signature(body, H200_STATE, MANUAL) != same
    unmixed = ChainSettings(instance_type_mixed_on_node=False)
    assert nodelabels.signature(body, H200_STATE, unmixed) != same


def _cache(**over: Any) -> deciding.Cache:
    cache: deciding.Cache = {
        naming.NAMESPACES: {Ref(resource=naming.NAMESPACES, name="default"): {}},
        naming.INSTANCETYPES: {},
    }
    cache.update(over)
    return cache


def test_a_pass_plans_flavors_and_the_nodes_they_select() -> None:
    managed = [facts_of(node_obj("a"), H200_STATE), facts_of(node_obj("cpu", "8"), None)]
    states = {"a": H200_STATE}
    decided = deciding.plan_pass(managed, states.get, _cache(), ChainSettings())
    selected = decided.flavor_nodes
    assert {n for nodes in selected.values() for n in nodes} == {"a", "cpu"}
    for ref, desired in decided.plan.kueue.items():
        if ref.resource == naming.RESOURCEFLAVORS:
            assert [n.name for n in managed if deciding.selects(desired, n)] == selected[ref.name]


def test_statuses_stamp_times_only_on_a_flip_and_skip_unchanged_ones() -> None:
    ref = Ref(resource=naming.INSTANCETYPES, name="it")
    ready = {"type": "Degraded", "status": "True", "reason": "R", "message": "m"}
    plan = ChainPlan(kueue={}, instance_types={}, statuses={"it": {"conditions": [ready]}},
                     catalog={}, entrances={})  # fmt: skip
    first = deciding.statuses(plan, {ref: {"metadata": {"name": "it"}}}, "T1")
    stamped = {**ready, "lastTransitionTime": "T1"}
    assert first == {ref: Desired(status={"conditions": [stamped]})}
    observed = {ref: {"metadata": {"name": "it"}, "status": {"conditions": [stamped]}}}
    assert deciding.statuses(plan, observed, "T2") == {}  # same status: no write, time kept


def test_activation_is_planned_once_keeping_other_conditions() -> None:
    ref = Ref(resource=naming.ADMISSIONCHECKS, name=naming.CHECK_NODE_DEVICES)
    other = {"type": "Other", "status": "False"}
    checks = {ref: {"metadata": {"name": ref.name}, "status": {"conditions": [other]}}}
    planned = deciding.activation(checks, T0.isoformat())
    assert planned is not None and planned[0] == ref
    conditions = (planned[1].status or {})["conditions"]
    assert conditions[0] == other and conditions[1]["type"] == "Active"
    active = {ref: {"metadata": {"name": ref.name}, "status": {"conditions": conditions}}}
    assert deciding.activation(active, "later") is None
    assert deciding.activation({}, "later") is None


def test_kueue_wait_doubles_while_absent_and_resets_when_found() -> None:
    wait = KueueWait.of(ChainSettings(retry_s=1.0, retry_cap_s=3.0))
    assert wait.due(0.0) and not wait.present
    assert wait.missed(10.0) == 1.0 and not wait.due(10.5) and wait.due(11.0)
    assert wait.missed(11.0) == 2.0 and wait.missed(13.0) == 3.0 and wait.missed(16.0) == 3.0
    assert wait.found() is True and wait.present and wait.found() is False
    assert wait.missed(20.0) == 1.0  # absent again: the back-off starts over


def test_only_owned_objects_are_deleted() -> None:
    ours = {"metadata": {"name": "gpustack-x",
                         "labels": {"app.kubernetes.io/part-of": "gpustack-operator"}}}  # fmt: skip
    assert deciding.owned(ours)
    assert not deciding.owned({"metadata": {"name": "gpustack-x"}})
    assert not deciding.owned({**ours, "metadata": {**ours["metadata"], "name": "theirs"}})

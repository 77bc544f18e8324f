"""The chain reconciler: InstanceTypes, their flavor catalog, the Kueue objects and the node
labels of the chain, made to match :func:`controlplane.chain.kueue.plan_chain`. Level-based.

Every ``period_s`` it lists what it depends on (Namespaces, InstanceTypes, the Kueue kinds: a
few objects); every ``fit_coalesce_s`` (3 s) in between it re-plans from the ledger *now* against
what it last listed or wrote, so a burst of allocations is one write per object per period, and
the fit labels and InstanceType statuses follow the ledger within one period.

The Nodes come from the worker's Node informer (:mod:`controlplane.k8s.informing`), never from a
list of its own: a pass looks again only at the *dirty* nodes, those the watch changed
(:meth:`ChainReconciler.node_changed`) or whose ledger state changed
(:meth:`ChainReconciler.state_changed`, told by the processor's fold), and at every node on a
*full* pass: the first, each ``period_s`` (over the cache: the safety net), after the informer
listed again, after an API error. Its own label patches' answers go into the informer
(:meth:`Informer.put`), so the watch's echo of them is no change. Invariants:

- write only on change: a patch carries only the owned fields that differ (:func:`owned_patch`,
  which never removes what Kueue or the API server defaulted), an unchanged plan writes nothing;
- created before referenced, deleted after unreferenced: Topologies, AdmissionChecks, flavors,
  ClusterQueues, LocalQueues in that order; deletions in reverse;
- only owned objects are deleted: labelled ``app.kubernetes.io/part-of=gpustack-operator`` and
  named ``gpustack-…``; InstanceTypes are never deleted (create-only);
- Kueue's CRDs absent (404 on a collection): the Kueue part waits ``retry_s``, doubling up to
  ``retry_cap_s``, logged at each try; InstanceTypes and labels go on. Any API error drops the
  cache (the next tick lists again and looks at every node) and never stops the loop;
- no plan from an empty cache: passes wait for the informer's first list;
- a node is looked at again when its Node or its ledger state changed, and every node at least
  every ``period_s``; a pass whose nodes' signatures all compare equal plans nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

import anyio
import anyio.lowlevel

from bus import events
from controlplane import errors
from controlplane.chain import fit, kueue, naming
from controlplane.chain.inventory import NodeFacts, facts_of
from controlplane.chain.kueue import ChainPlan, plan_chain
from controlplane.chain.settings import ChainSettings
from controlplane.k8s.client import KubeClient
from controlplane.k8s.informing import Informer
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling.nodestates import Ledger
from controlplane.reconciling.planning import Desired
from controlplane.resources import NODES, Ref, Resource
from kit.backoff import Backoff

__all__ = ["ChainReconciler", "owned_patch"]

log = logging.getLogger(__name__)

_DELETE_ORDER: Final = tuple(reversed(naming.KUEUE_KINDS))


def owned_patch(current: Any, desired: Any) -> Any:
    """The merge patch setting ``desired``'s keys on ``current`` (``{}``: nothing differs).

    Keys ``desired`` does not name are left alone (server defaults, other writers); a ``None``
    value removes its key when present. Lists are replaced whole.
    """
    if not isinstance(desired, dict) or not isinstance(current, dict):
        return desired
    out: dict[str, Any] = {}
    for key, value in desired.items():
        if value is None:
            if key in current:
                out[key] = None
        elif isinstance(value, dict) and isinstance(current.get(key), dict):
            sub = owned_patch(current[key], value)
            if sub:
                out[key] = sub
        elif current.get(key) != value:
            out[key] = _clean(value)
    return out


def _clean(value: Any) -> Any:
    """A value to write: ``None`` members of a new dict are dropped (nothing to remove)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    return value


def _owned(body: Mapping[str, Any]) -> bool:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    return labels.get("app.kubernetes.io/part-of") == "gpustack-operator" and str(
        meta.get("name", "")
    ).startswith("gpustack-")


def _ref(resource: Resource, body: Mapping[str, Any]) -> Ref:
    meta = body.get("metadata") or {}
    ns = meta.get("namespace") if resource.namespaced else None
    return Ref(resource=resource, name=meta["name"], namespace=ns)


def _is_active(body: Mapping[str, Any]) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


class ChainReconciler:
    """Owns the chain's objects; :meth:`run` until cancelled (leader only, beside the running
    Node informer it reads)."""

    def __init__(
        self,
        *,
        api: KubeClient,
        ledger: Ledger,
        nodes: Informer,
        settings: ChainSettings,
        metrics: WorkerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], datetime] = events.now,
    ) -> None:
        self._api = api
        self._ledger = ledger
        self._nodes = nodes
        nodes.listen(self.node_changed)
        self._dirty: set[str] = set()
        """Nodes to look at again (bounded by the node count); swapped out by each pass."""
        self._lists_seen = -1
        """The informer's list count at the last full pass: another list means a full pass."""
        self.settings = settings
        self._metrics = metrics
        self._clock = clock
        self._wallclock = wallclock
        self._cache: dict[Resource, dict[Ref, dict[str, Any]]] | None = None
        self._listed_at = float("-inf")
        self._kueue_retry_at = float("-inf")
        self._kueue_misses = 0
        """Consecutive lists that found Kueue's CRDs absent: the attempt of :attr:`_kueue_backoff`."""
        self._kueue_backoff = Backoff(
            min(settings.retry_s, settings.retry_cap_s), settings.retry_cap_s
        )
        self.kueue_present = False
        self.entrances: dict[str, str] = {}
        """LocalQueue name -> accelerator group, from the last plan (the Workload webhook)."""
        self.nodes: dict[str, NodeFacts] = {}
        """Managed nodes as last planned (the admission check reads them)."""
        self.flavor_nodes: dict[str, list[str]] = {}
        self._replan = False
        """A write this pass changes the next plan (a check turned Active): plan again."""
        self._seen: dict[str, tuple[tuple[Any, ...], NodeFacts | None]] = {}
        """Per node: the signature last reconciled and the facts it gave."""

    def entrance(self, local_queue: str) -> str | None:
        return self.entrances.get(local_queue)

    def node_changed(self, kind: str, name: str, body: dict[str, Any]) -> None:
        """The informer's listener: the Node was added, changed or deleted."""
        self._dirty.add(name)

    def state_changed(self, node: str) -> None:
        """The node's ledger state changed (the processor's fold)."""
        self._dirty.add(node)

    async def run(self) -> None:
        """Reconcile every ``fit_coalesce_s`` until cancelled; errors are logged and retried."""
        while True:
            try:
                await self.reconcile()
            except errors.ApiError as e:
                log.warning(
                    "scheduling chain: %s; listing again in %.1fs", e, self.settings.retry_s
                )
                self._cache = None
                self._seen.clear()
                await anyio.sleep(self.settings.retry_s)
                continue
            await anyio.sleep(self.settings.fit_coalesce_s)

    def instance_type_objects(self) -> list[dict[str, Any]]:
        """The InstanceType objects as last listed or written (empty before the first list)."""
        if self._cache is None:
            return []
        return list(self._cache[naming.INSTANCETYPES].values())

    async def reconcile(self) -> None:
        """One pass: list when due, look at the dirty nodes (every node on a full pass), plan
        from the ledger now, write what differs.

        A pass in which no node's ledger state or Node changed and nothing was listed plans
        nothing (a thousand idle nodes cost nothing; a full pass one signature each).
        """
        await self._nodes.ready.wait()
        started = self._clock()
        changed, self._replan = self._replan, False
        full = self._nodes.lists != self._lists_seen
        if self._cache is None or started - self._listed_at >= self.settings.period_s:
            await self._list()
            changed = full = True
        self._lists_seen = self._nodes.lists
        changed = await self._look_at_nodes(full) or changed
        cache = self._cache
        assert cache is not None
        if changed:
            managed = [
                facts
                for name in self._nodes.objects
                if (seen := self._seen.get(name)) is not None and (facts := seen[1]) is not None
            ]
            self.nodes = {n.name: n for n in managed}
            plan = self._plan(managed, cache)
            self.entrances = plan.entrances
            await self._converge_instance_types(plan, cache)
            await self._converge_set(naming.INSTANCETYPEFLAVORS, plan.catalog, cache)
            if self.kueue_present:
                await self._converge_kueue(plan, cache)
        if self._metrics is not None:
            self._metrics.reconcile_seconds.labels(kind="chain").observe(self._clock() - started)

    async def _look_at_nodes(self, full: bool) -> bool:
        """Label the dirty nodes (every node when ``full``) and forget the deleted ones;
        whether anything about a node changed."""
        dirty, self._dirty = self._dirty, set()
        objects = self._nodes.objects
        changed = False
        for name in list(self._seen) if full else dirty:
            if name not in objects and self._seen.pop(name, None) is not None:
                changed = True
        look = list(objects) if full else [n for n in dirty if n in objects]
        for i, name in enumerate(look):
            if i % 100 == 99:
                await anyio.lowlevel.checkpoint()  # let the bus and the webhooks run
            body = self._nodes.objects.get(name)  # the map may have changed meanwhile
            if body is not None and await self._label_node(body):
                changed = True
        return changed

    def _plan(
        self, managed: list[NodeFacts], cache: Mapping[Resource, Mapping[Ref, Any]]
    ) -> ChainPlan:
        allocations = {
            n.name: list(state.allocations.values())
            for n in managed
            if (state := self._ledger.get(n.name)) is not None
        }
        names = [r.name for r in cache[naming.NAMESPACES]]
        its = {r.name: b for r, b in cache[naming.INSTANCETYPES].items()}
        cqs = {r.name: b for r, b in cache.get(naming.CLUSTERQUEUES, {}).items()}
        checks = cache.get(naming.ADMISSIONCHECKS, {})
        active = [r.name for r, b in checks.items() if _is_active(b)]
        plan = plan_chain(
            managed, allocations=allocations, namespaces=names, instance_types=its,
            cluster_queues=cqs, active_checks=active, settings=self.settings,
        )  # fmt: skip
        self.flavor_nodes = {
            name: [n.name for n in managed if _selects(desired, n)]
            for ref, desired in plan.kueue.items()
            if ref.resource == naming.RESOURCEFLAVORS
            for name in [ref.name]
        }
        return plan

    async def _list(self) -> None:
        cache: dict[Resource, dict[Ref, dict[str, Any]]] = {}
        for resource in (
            naming.NAMESPACES,
            naming.INSTANCETYPES,
            naming.INSTANCETYPEFLAVORS,
        ):
            cache[resource] = {_ref(resource, b): b for b in await self._api.list(resource)}
        if self.settings.manage_kueue and self._clock() >= self._kueue_retry_at:
            await self._list_kueue(cache)
        elif self.kueue_present and self._cache is not None:
            for resource in naming.KUEUE_KINDS:
                cache[resource] = self._cache.get(resource, {})
        self._cache = cache
        self._listed_at = self._clock()

    async def _list_kueue(self, cache: dict[Resource, dict[Ref, dict[str, Any]]]) -> None:
        try:
            for resource in naming.KUEUE_KINDS:
                cache[resource] = {_ref(resource, b): b for b in await self._api.list(resource)}
        except errors.NotFound:
            wait = self._kueue_backoff.delay_s(self._kueue_misses)
            log.warning(
                "Kueue's CRDs (%s/%s) are not installed: the Kueue objects wait; trying "
                "again in %.0fs", naming.KUEUE_GROUP, naming.KUEUE_VERSION, wait,
            )  # fmt: skip
            self.kueue_present = False
            for resource in naming.KUEUE_KINDS:
                cache.pop(resource, None)
            self._kueue_retry_at = self._clock() + wait
            self._kueue_misses += 1
            return
        if not self.kueue_present:
            log.info("Kueue's CRDs are installed: managing the Kueue objects")
        self.kueue_present = True
        self._kueue_misses = 0

    def _signature(self, body: Mapping[str, Any]) -> tuple[Any, ...]:
        """What a node's facts and labels are made of: equal signatures, equal results."""
        meta = body.get("metadata") or {}
        state = self._ledger.get(meta["name"])
        return (
            tuple(sorted((meta.get("labels") or {}).items())),
            tuple(sorted((meta.get("annotations") or {}).items())),
            repr((body.get("status") or {}).get("allocatable") or body.get("status")),
            state.groups if state else None,
            tuple(state.allocations.values()) if state else None,
        )

    async def _label_node(self, body: dict[str, Any]) -> bool:
        """Managed, general key, profile and fit labels, patched only where they differ;
        whether anything about the node changed (its facts are in :attr:`_seen`)."""
        meta = body.get("metadata") or {}
        name = meta["name"]
        signature = self._signature(body)
        known = self._seen.get(name)
        if known is not None and known[0] == signature:
            return False
        labels: dict[str, str] = meta.get("labels") or {}
        want: dict[str, str | None] = {}
        if not self.settings.node_management_manual:
            want[naming.MANAGED] = "true"
        facts = None
        if want.get(naming.MANAGED, labels.get(naming.MANAGED)) == "true":
            facts = facts_of(body, self._ledger.get(name))
            want[f"{naming.GENERAL_PREFIX}{facts.general}"] = "true"
            if naming.PROFILE not in labels:
                want[naming.PROFILE] = naming.DEFAULT_PROFILE
            want.update(fit.fit_labels(facts))
        for key in labels:
            owned = fit.is_fit_label(key) or key.startswith(naming.GENERAL_PREFIX)
            if owned and key not in want:
                want[key] = None
        patch = {k: v for k, v in want.items() if labels.get(k) != v}
        if patch:
            body = await self._api.patch(
                Ref(resource=NODES, name=name), {"metadata": {"labels": patch}}
            )
            self._nodes.put(body)  # its watch echo has this resourceVersion: no change
            if facts is not None:
                facts = facts_of(body, self._ledger.get(name))
        self._seen[name] = (self._signature(body), facts)
        return True

    async def _converge_instance_types(
        self, plan: ChainPlan, cache: dict[Resource, dict[Ref, dict[str, Any]]]
    ) -> None:
        observed = cache[naming.INSTANCETYPES]
        for name, desired in plan.instance_types.items():
            ref = Ref(resource=naming.INSTANCETYPES, name=name)
            if ref not in observed:
                observed[ref] = await self._create(ref, desired)
        now = self._wallclock().strftime("%Y-%m-%dT%H:%M:%SZ")
        for ref, body in list(observed.items()):
            wanted = plan.statuses.get(ref.name)
            if wanted is None:
                continue
            status = kueue.stamp_conditions(wanted, body.get("status"), now)
            if body.get("status") == status:
                continue
            patch = owned_patch(body.get("status") or {}, status)
            if not patch:
                continue
            for condition in patch.get("conditions") or []:  # said once, when it changes
                log.warning("InstanceType %s: %s: %s", ref.name, condition["reason"],
                            condition.get("message", ""))  # fmt: skip
            meta = {"resourceVersion": body["metadata"].get("resourceVersion")}
            observed[ref] = await self._api.patch(
                ref, {"metadata": meta, "status": patch}, subresource="status"
            )

    async def _create(self, ref: Ref, desired: Desired) -> dict[str, Any]:
        body: dict[str, Any] = {
            "apiVersion": ref.resource.api_version,
            "kind": ref.resource.kind,
            "metadata": {"name": ref.name, **_clean(desired.metadata)},
        }
        if ref.namespace:
            body["metadata"]["namespace"] = ref.namespace
        if desired.spec is not None:
            body["spec"] = _clean(desired.spec)
        try:
            return await self._api.create(ref, body)
        except errors.Conflict:
            return await self._api.get(ref)  # made meanwhile: the next pass patches it

    async def _converge_set(
        self,
        resource: Resource,
        desired: Mapping[str, Desired] | Mapping[Ref, Desired],
        cache: dict[Resource, dict[Ref, dict[str, Any]]],
        *,
        delete: bool = True,
    ) -> None:
        observed = cache.setdefault(resource, {})
        wanted: dict[Ref, Desired] = {
            (k if isinstance(k, Ref) else Ref(resource=resource, name=k)): v
            for k, v in desired.items()
        }
        for ref, want in wanted.items():
            body = observed.get(ref)
            if body is None:
                observed[ref] = await self._create(ref, want)
                continue
            main = {
                k: v
                for k, v in (
                    ("metadata", owned_patch(body.get("metadata") or {}, want.metadata)),
                    ("spec", owned_patch(body.get("spec") or {}, want.spec or {})),
                )
                if v
            }
            if main:
                main.setdefault("metadata", {})["resourceVersion"] = body["metadata"].get(
                    "resourceVersion"
                )
                observed[ref] = await self._api.patch(ref, main)
        if delete:
            await self._delete_unwanted(resource, wanted, observed)

    async def _delete_unwanted(
        self, resource: Resource, wanted: Mapping[Ref, Any], observed: dict[Ref, dict[str, Any]]
    ) -> None:
        for ref, body in list(observed.items()):
            if ref not in wanted and _owned(body):
                try:
                    await self._api.delete(ref)
                except errors.NotFound:
                    pass
                observed.pop(ref, None)

    async def _converge_kueue(
        self, plan: ChainPlan, cache: dict[Resource, dict[Ref, dict[str, Any]]]
    ) -> None:
        for resource in naming.KUEUE_KINDS:
            part = {r: d for r, d in plan.kueue.items() if r.resource == resource}
            await self._converge_set(resource, part, cache, delete=False)
            if resource == naming.ADMISSIONCHECKS:
                await self._activate(cache[resource])
        for resource in _DELETE_ORDER:
            part = {r: d for r, d in plan.kueue.items() if r.resource == resource}
            await self._delete_unwanted(resource, part, cache.setdefault(resource, {}))

    async def _activate(self, checks: dict[Ref, dict[str, Any]]) -> None:
        """Set ``Active`` on the check this process controls (an ACC's duty)."""
        ref = Ref(resource=naming.ADMISSIONCHECKS, name=naming.CHECK_NODE_DEVICES)
        body = checks.get(ref)
        if body is None or _is_active(body):
            return
        condition = {
            "type": "Active", "status": "True", "reason": "Active",
            "message": "the gpustack worker answers this check",
            "lastTransitionTime": self._wallclock().strftime("%Y-%m-%dT%H:%M:%SZ"),
        }  # fmt: skip
        others = [
            c
            for c in (body.get("status") or {}).get("conditions") or []
            if c.get("type") != "Active"
        ]
        meta = {"resourceVersion": body["metadata"].get("resourceVersion")}
        self._replan = True  # the queues list the check once it is Active
        checks[ref] = await self._api.patch(
            ref, {"metadata": meta, "status": {"conditions": [*others, condition]}},
            subresource="status",
        )  # fmt: skip


def _selects(flavor: Desired, node: NodeFacts) -> bool:
    """Whether the flavor's nodeLabels select ``node`` (by the facts they were made from)."""
    labels = (flavor.spec or {}).get("nodeLabels") or {}
    if labels.get(naming.OS) != node.os or labels.get(naming.ARCH) != node.arch:
        return False
    if labels.get(naming.PROFILE) != node.profile:
        return False
    if labels.get(f"{naming.GENERAL_PREFIX}{node.general}") != "true":
        return False
    counts = {
        k.removeprefix(naming.ACCELERATED_PREFIX).removesuffix(".count"): v
        for k, v in labels.items()
        if k.startswith(naming.ACCELERATED_PREFIX) and k.endswith(".count")
    }
    if not counts:
        return True
    return all(str(len(node.group_cards(g))) == v for g, v in counts.items())

"""The admission check controller of ``gpustack-node-devices`` (gate 3 of the chain).

After Kueue reserved quota for a Workload and placed it (TAS), this controller checks that the
node(s) it was given can really hold every pod now, per family and per card, against the
ledger plus the Workloads admitted but not yet allocated (:func:`controlplane.chain.fit.decide`),
and writes its entry of ``status.admissionChecks``: ``Ready`` or ``Retry`` (with
``requeueAfterSeconds``), never ``Rejected``, never a preemption.

Which Workloads: those with ``QuotaReserved=True``, not ``Evicted`` and not ``Finished``, whose
``status.admissionChecks`` holds a ``gpustack-node-devices`` entry still ``Pending``. The nodes
of a PodSet come from its ``topologyAssignment`` (``levels`` ending in ``kubernetes.io/hostname``
and ``domains[{values, count}]``); without one, from the nodes of the flavor assigned to its
credits (each pod may land on any of them). The entry is written with a merge patch of
``status.admissionChecks`` under a ``resourceVersion`` precondition: a Workload that changed
meanwhile (409) is checked again at the next pass with what it says then.

Pure parts: :func:`pending_check`, :func:`assignments`, :func:`in_flight`, :func:`with_state`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import anyio

from bus import events
from controlplane import errors
from controlplane.chain import fit, naming
from controlplane.chain.reconciler import ChainReconciler
from controlplane.k8s.client import KubeClient
from controlplane.reconciling.nodestates import Ledger
from controlplane.resources import Ref

__all__ = ["AdmissionChecker", "assignments", "in_flight", "pending_check", "with_state"]

log = logging.getLogger(__name__)

RETRY_AFTER_S: Final = 15
Assignment = list[tuple[str | tuple[str, ...], int]]


def _condition(body: Mapping[str, Any], kind: str) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    for entry in (body.get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == naming.CHECK_NODE_DEVICES:
            return dict(entry)
    return None


def pending_check(body: Mapping[str, Any]) -> bool:
    """The Workload waits for this check's answer."""
    entry = _entry(body)
    return (
        entry is not None
        and entry.get("state", "Pending") == "Pending"
        and _condition(body, "QuotaReserved")
        and not _condition(body, "Evicted")
        and not _condition(body, "Finished")
    )


def _hosts(topology: Mapping[str, Any]) -> list[tuple[str, int]]:
    levels = topology.get("levels") or []
    if not levels or levels[-1] != naming.HOSTNAME:
        return []
    return [
        (d["values"][-1], int(d.get("count", 1)))
        for d in topology.get("domains") or []
        if d.get("values")
    ]


def assignments(
    body: Mapping[str, Any], flavor_nodes: Mapping[str, Sequence[str]]
) -> list[tuple[str, list[fit.Demand], Assignment]]:
    """Each PodSet's per-pod demands and where its pods go."""
    specs = {p.get("name", "main"): p for p in (body.get("spec") or {}).get("podSets") or []}
    admission = (body.get("status") or {}).get("admission") or {}
    out: list[tuple[str, list[fit.Demand], Assignment]] = []
    for assigned in admission.get("podSetAssignments") or []:
        name = assigned.get("name", "main")
        spec = specs.get(name) or {}
        demands = fit.demands_of(((spec.get("template") or {}).get("spec")) or {})
        count = int(assigned.get("count", spec.get("count", 1)))
        hosts = _hosts(assigned.get("topologyAssignment") or {})
        where: Assignment = list(hosts)
        if not where:
            flavors = (assigned.get("flavors") or {}).values()
            nodes = tuple(n for f in flavors for n in flavor_nodes.get(f, ()))
            where = [(tuple(dict.fromkeys(nodes)), count)]
        out.append((name, demands, where))
    return out


def in_flight(
    bodies: Iterable[Mapping[str, Any]],
    allocated_pods: set[tuple[str, str]],
    flavor_nodes: Mapping[str, Sequence[str]],
) -> list[tuple[list[fit.Demand], Assignment]]:
    """Workloads this check passed whose pods hold no allocation yet (their cards are taken)."""
    out: list[tuple[list[fit.Demand], Assignment]] = []
    for body in bodies:
        entry = _entry(body)
        if entry is None or entry.get("state") != "Ready" or _condition(body, "Finished"):
            continue
        if _condition(body, "Evicted") or _condition(body, "PodsReady"):
            continue
        meta = body.get("metadata") or {}
        pods = {
            (meta.get("namespace", ""), o.get("name", ""))
            for o in meta.get("ownerReferences") or []
            if o.get("kind") == "Pod"
        }
        if pods and pods <= allocated_pods:
            continue
        out += [(demands, where) for _, demands, where in assignments(body, flavor_nodes)]
    return out


def with_state(
    body: Mapping[str, Any], verdict: fit.Verdict, now: datetime
) -> list[dict[str, Any]]:
    """``status.admissionChecks`` with this check's entry answered."""
    out = []
    for entry in (body.get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == naming.CHECK_NODE_DEVICES:
            entry = {
                "name": naming.CHECK_NODE_DEVICES, "state": verdict.state,
                "message": verdict.message[:1024],
                "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }  # fmt: skip
            if verdict.state == "Retry":
                entry["requeueAfterSeconds"] = RETRY_AFTER_S
        out.append(entry)
    return out


class AdmissionChecker:
    """Answers ``gpustack-node-devices`` for pending Workloads every ``period_s``."""

    def __init__(
        self,
        *,
        api: KubeClient,
        ledger: Ledger,
        chain: ChainReconciler,
        period_s: float = 1.0,
        wallclock: Callable[[], datetime] = events.now,
    ) -> None:
        self._api = api
        self._ledger = ledger
        self._chain = chain
        self._period_s = period_s
        self._wallclock = wallclock
        self.answered = 0

    async def run(self) -> None:
        while True:
            try:
                if self._chain.settings.manage_kueue and self._chain.kueue_present:
                    await self.check_once()
            except errors.ApiError as e:
                log.warning("admission check %s: %s", naming.CHECK_NODE_DEVICES, e)
            await anyio.sleep(self._period_s)

    def _allocated_pods(self) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for node in self._ledger.nodes():
            state = self._ledger.get(node)
            for a in state.allocations.values() if state else ():
                if a.action == "allocated" and a.pod_namespace and a.pod_name:
                    out.add((a.pod_namespace, a.pod_name))
        return out

    async def check_once(self) -> None:
        """One pass over every Workload."""
        bodies = await self._api.list(naming.WORKLOADS)
        pending = [b for b in bodies if pending_check(b)]
        if not pending:
            return
        flavor_nodes = self._chain.flavor_nodes
        cards = {name: list(n.cards) for name, n in self._chain.nodes.items()}
        flying = in_flight(bodies, self._allocated_pods(), flavor_nodes)
        for body in pending:
            verdict = fit.decide(cards, assignments(body, flavor_nodes), flying)
            meta = body["metadata"]
            ref = Ref(resource=naming.WORKLOADS, name=meta["name"], namespace=meta.get("namespace"))
            patch = {
                "metadata": {"resourceVersion": meta.get("resourceVersion")},
                "status": {"admissionChecks": with_state(body, verdict, self._wallclock())},
            }
            try:
                await self._api.patch(ref, patch, subresource="status")
            except (errors.Conflict, errors.NotFound):
                continue  # changed or gone: the next pass sees it as it is
            self.answered += 1
            log.info("workload %s: %s %s (%s)", ref, naming.CHECK_NODE_DEVICES, verdict.state,
                     verdict.message)  # fmt: skip
            if verdict.state == "Ready":
                flying += [(d, w) for _, d, w in assignments(body, flavor_nodes)]

"""What fills the served mirrors: the worker's informers with a cluster, its bus ledger without.

- :class:`InformerFeed`: one :class:`~controlplane.k8s.informing.Informer` of the stored
  ``v1alpha1`` resource (run in every replica: each answers reads) tells every change; the
  mirror holds the v1 view of each body, at the API server's resourceVersions. :meth:`sync`
  carries the informer's progress (its list's and bookmarks' versions) over, and marks the
  mirror ready once the informer listed. No read ever goes to the API.
- :class:`LedgerFeed` (``standalone``, ``--kubeconfig=none``): every ``period_s`` the bodies are
  computed from the bus ledger with the same pure functions the reconcilers write with
  (``Devices``, ``NodeModelStore``, and the scheduling chain's plan for ``InstanceType`` and
  ``InstanceTypeFlavor``), and what differs becomes changes at the mirror's own versions.
  Condition timestamps are stamped at each computation, so bodies are compared without them:
  an unchanged node is no change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import anyio

from controlplane.chain import inventory
from controlplane.chain.kueue import plan_chain
from controlplane.chain.settings import ChainSettings
from controlplane.extension.workergroup import catalog
from controlplane.extension.workergroup.mirror import Key, Mirror, key_of
from controlplane.k8s.informing import Informer
from controlplane.reconciling import objects
from controlplane.reconciling.ledger import Ledger, NodeState
from controlplane.reconciling.planning import Desired

__all__ = ["InformerFeed", "LedgerFeed", "ledger_bodies"]


class InformerFeed:
    """Keeps ``mirror`` equal to ``informer``'s objects, as v1 views."""

    def __init__(self, informer: Informer, mirror: Mirror) -> None:
        self.informer, self.mirror = informer, mirror
        informer.listen(self._changed)

    def _changed(self, kind: str, _key: str, body: dict[str, Any]) -> None:
        self.mirror.put(kind, catalog.view(body))

    def sync(self) -> None:
        """Carry the informer's resourceVersion and readiness over (cheap; every request)."""
        text = self.informer.resource_version
        if not self.informer.ready.is_set():
            return
        version = int(text) if text.isdigit() else None
        if not self.mirror.ready:
            self.mirror.replace((catalog.view(b) for b in self.informer.objects.values()), version)
        elif version is not None:
            self.mirror.advance(version)


def _stamp(kind: str, name: str, desired: Desired, status: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": catalog.GROUP_VERSION, "kind": kind,
        "metadata": {"name": name, **desired.metadata},
    }  # fmt: skip
    if desired.spec is not None:
        body["spec"] = desired.spec
    if (status or desired.status) is not None:
        body["status"] = status if status is not None else desired.status
    return body


def ledger_bodies(
    ledger: Ledger, spec_for: Callable[[str], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Resource -> the v1 bodies the ledger makes (pure: no versions, no creation times)."""
    states: dict[str, NodeState] = {
        n: s for n in sorted(ledger.nodes()) if (s := ledger.get(n)) is not None
    }
    out: dict[str, list[dict[str, Any]]] = {r: [] for r in catalog.RESOURCES}
    for node, state in states.items():
        devices, _ = objects.devices(node, None, state)
        if devices is not None:
            out["devices"].append(_stamp("Devices", node, devices))
        store = objects.node_model_store(node, None, state, spec_for(node))
        if store is not None:
            out["nodemodelstores"].append(_stamp("NodeModelStore", node, store))
    facts = [inventory.facts_of({"metadata": {"name": n}}, s) for n, s in states.items()]
    plan = plan_chain(
        facts, allocations={n: list(s.allocations.values()) for n, s in states.items()},
        namespaces=(), instance_types={}, cluster_queues={}, active_checks=(),
        settings=ChainSettings(manage_kueue=False),
    )  # fmt: skip
    for name, desired in sorted(plan.instance_types.items()):
        out["instancetypes"].append(_stamp("InstanceType", name, desired, plan.statuses.get(name)))
    for name, desired in sorted(plan.catalog.items()):
        out["instancetypeflavors"].append(_stamp("InstanceTypeFlavor", name, desired))
    return out


def _timeless(value: Any) -> Any:
    """``value`` without ``lastTransitionTime`` and the served metadata (compared bodies)."""
    if isinstance(value, dict):
        return {
            k: _timeless(v) for k, v in value.items()
            if k not in ("lastTransitionTime", "resourceVersion", "creationTimestamp", "uid")
        }  # fmt: skip
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LedgerFeed:
    """Recomputes the served bodies from ``ledger`` every ``period_s`` (see the module)."""

    def __init__(
        self,
        ledger: Ledger,
        mirrors: Mapping[str, Mirror],
        *,
        spec_for: Callable[[str], dict[str, Any]] = lambda _node: objects.NMS_SPEC_DEFAULT,
        period_s: float = 1.0,
    ) -> None:
        self._ledger, self._mirrors = ledger, mirrors
        self._spec_for, self._period_s = spec_for, period_s

    def sync(self) -> None:
        """One computation, applied (every mirror is ready after the first)."""
        made = ledger_bodies(self._ledger, self._spec_for)
        for resource, mirror in self._mirrors.items():
            self._apply(mirror, made.get(resource, []))

    def _apply(self, mirror: Mirror, bodies: Iterable[dict[str, Any]]) -> None:
        fresh: dict[Key, dict[str, Any]] = {k: b for b in bodies if (k := key_of(b)) is not None}
        for key in sorted(mirror.objects.keys() - fresh.keys()):
            mirror.put("DELETED", _versioned(mirror.objects[key], mirror.version + 1))
        for key in sorted(fresh):
            held = mirror.objects.get(key)
            if held is not None and _timeless(held) == _timeless(fresh[key]):
                continue
            created = (held or {}).get("metadata", {}).get("creationTimestamp") or _now()
            body = fresh[key]
            body = {**body, "metadata": {**body["metadata"], "creationTimestamp": created}}
            mirror.put("MODIFIED", _versioned(body, mirror.version + 1))
        if not mirror.ready:
            mirror.replace(list(mirror.objects.values()), mirror.version)

    async def run(self) -> None:
        while True:
            self.sync()
            await anyio.sleep(self._period_s)


def _versioned(body: dict[str, Any], version: int) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "resourceVersion": str(version)}}

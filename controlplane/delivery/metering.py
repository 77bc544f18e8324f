"""The ModelStoreBinding meter: counts each binding's usage, writes its status, hands the quotas on.

Leader only. One :meth:`BindingMeter.refresh` lists the bindings, the ModelStores, the Nodes
(from the worker's Node informer once it has listed) and the ModelArtifacts, takes every
node's models from the ledger (the bus's ``models`` events), and decides with
:mod:`controlplane.stores.bindings`. A status is patched only when it differs (times of
unchanged conditions kept); a namespace whose quotas changed is handed to ``on_quotas``, which
makes the artifact reconciler push that namespace's artifact records again with the new
figures (the agents enforce the quota at mount time from those records).

The count lags the nodes by at most one period: a download that starts between two counts is
not yet in ``usedBytes``, so two mounts on two nodes in the same period may both be admitted.
The quota bounds what the namespace takes over time; it is not a reservation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import anyio

from bus import events, records
from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.k8s.informing import Informer
from controlplane.reconciling.nodestates import Ledger
from controlplane.resources import (
    MODELARTIFACTS,
    MODELSTOREBINDINGS,
    MODELSTORES,
    NODES,
    Ref,
    Resource,
)
from controlplane.stores import bindings
from kit.latest import Latest

__all__ = ["BindingMeter", "list_or_none", "node_labels", "without_times"]

log = logging.getLogger(__name__)

Quotas = tuple[records.BindingQuota, ...]


async def list_or_none(api: KubeClient, resource: Resource) -> list[dict[str, Any]]:
    """Every object of ``resource``; none while its CRD is not served."""
    try:
        return await api.list(resource)
    except errors.NotFound:
        return []


async def node_labels(api: KubeClient, nodes: Informer | None) -> dict[str, Mapping[str, str]]:
    """Node -> labels, from the informer once it listed, else from the API."""
    held = nodes.held() if nodes is not None else None
    bodies = held.values() if held is not None else await api.list(NODES)
    return {n["metadata"]["name"]: (n["metadata"].get("labels") or {}) for n in bodies}


class BindingMeter:
    """The bindings' usage as last counted, and the quotas the agents get."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        quotas: Latest[str, Quotas] | None = None,
        on_quotas: Callable[[str], None] = lambda _ns: None,
    ) -> None:
        """``quotas`` is where the decided quotas go (made first, its ``get`` given to the
        artifact reconciler); ``on_quotas`` is told each namespace whose quotas changed."""
        self._ledger = ledger
        self._on_quotas = on_quotas
        self._quotas: Latest[str, Quotas] = quotas if quotas is not None else Latest(())
        self.bindings: list[dict[str, Any]] = []
        """The bindings as last listed (the prefetch reconciler reads ``allowPinned``)."""

    def quotas(self, namespace: str) -> Quotas:
        """What the artifact records of ``namespace`` carry (empty: no binding there)."""
        return self._quotas.get(namespace)

    def models(self) -> dict[str, tuple[events.ModelState, ...] | None]:
        return {n: s.models for n in self._ledger.nodes() if (s := self._ledger.get(n))}

    async def refresh(self, api: KubeClient, nodes: Informer | None = None) -> None:
        """Count, write the statuses that changed, hand on the quotas that changed."""
        found = await list_or_none(api, MODELSTOREBINDINGS)
        self.bindings = found
        stores = await list_or_none(api, MODELSTORES)
        node_store = bindings.node_stores(stores, await node_labels(api, nodes))
        digests = bindings.namespace_digests(await list_or_none(api, MODELARTIFACTS))
        models = self.models()
        existing = [s["metadata"]["name"] for s in stores]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        usage: dict[str, int] = {}
        for b in found:
            meta = b["metadata"]
            ns = meta.get("namespace") or ""
            used = bindings.used_bytes(
                bindings.store_refs(b), digests.get(ns, {}), node_store, models
            )
            usage[f"{ns}/{meta['name']}"] = used
            status = bindings.binding_status(b, existing, used, now)
            if without_times(b.get("status")) != without_times(status):
                ref = Ref(resource=MODELSTOREBINDINGS, name=meta["name"], namespace=ns)
                try:
                    await api.patch(ref, {"status": status}, subresource="status")
                except errors.ApiError as e:  # the others are still written, quotas handed on
                    log.warning("modelstorebinding %s/%s: %s", ns, meta["name"], e)
        self._hand_on(bindings.quotas(found, usage))

    def _hand_on(self, fresh: dict[str, Quotas]) -> None:
        for ns in self._quotas.replace(fresh):
            self._on_quotas(ns)

    async def run(self, api: KubeClient, period_s: float, nodes: Informer | None) -> None:
        """:meth:`refresh` every ``period_s`` until cancelled (failures logged, retried)."""
        while True:
            try:
                await self.refresh(api, nodes)
            except errors.ApiError as e:
                log.warning("metering the ModelStoreBindings failed: %s", e)
            await anyio.sleep(period_s)


def without_times(status: Any) -> Any:
    """``status`` without its conditions' ``lastTransitionTime`` (what decides a write)."""
    if not isinstance(status, dict):
        return status
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
    ]
    return {**status, "conditions": conditions}

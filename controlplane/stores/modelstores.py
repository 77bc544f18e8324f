"""The ``ModelStore`` pool layer: which store wins each node, and every store's status.

:class:`ModelStores` keeps the last listed stores (the node reconciler asks it for a node's
spec through :meth:`ModelStores.spec_for`, with the current settings) and, in the leader, writes
each store's status (``nodes``, ``Ready``, ``SelectorOverlap``) when it changes. The decisions are
in :mod:`controlplane.stores.storespec` and :func:`controlplane.reconciling.planning.plan` (a condition's
observed ``lastTransitionTime`` kept while its status holds); this module only lists and writes,
through the one executor (:mod:`controlplane.reconciling.applying`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from controlplane import errors
from controlplane.clustersettings.catalog import Values
from controlplane.k8s.client import KubeClient
from controlplane.k8s.informing import Informer
from controlplane.reconciling import applying
from controlplane.reconciling.planning import Desired, plan, settle_conditions
from controlplane.reconciling.sinks import KubeSink
from controlplane.resources import MODELSTORES, NODES, Observed, Ref
from controlplane.stores import storespec

__all__ = ["ModelStores"]

log = logging.getLogger(__name__)


class ModelStores:
    """The stores as last listed (none without a cluster)."""

    def __init__(
        self,
        values: Callable[[], Values],
        pins: Callable[[str], tuple[str, ...]] = lambda _node: (),
    ) -> None:
        """``pins``: the digests ModelPrefetches pin on a node (the prefetcher's latest)."""
        self._values = values
        self._pins = pins
        self.stores: list[dict[str, Any]] = []

    def spec_for(self, labels: Mapping[str, str], node: str = "") -> dict[str, Any]:
        """The desired NodeModelStore spec of ``node`` with ``labels`` (its pins included)."""
        spec = storespec.from_settings(self._values())
        spec = storespec.with_store(spec, storespec.winner(self.stores, labels))
        pinned = self._pins(node) if node else ()
        if pinned:
            spec["pinned"] = list(pinned)
        return spec

    def respec(self, desired: Desired, observed: Observed | None) -> Desired:
        """The user's edits of the observed spec kept (:func:`storespec.respec`)."""
        return storespec.respec(desired, observed)

    async def refresh(self, api: KubeClient, nodes: Informer) -> None:
        """List the stores again and write every store status that changed.

        The Nodes' labels come from ``nodes`` (the worker's Node informer); until its first list
        the Nodes are listed here.
        """
        try:
            self.stores = await api.list(MODELSTORES)
        except errors.NotFound:  # the CRD is not served (yet)
            self.stores = []
            return
        if not self.stores:
            return
        held = nodes.held()
        bodies = held.values() if held is not None else await api.list(NODES)
        labels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}) for n in bodies}
        sink = KubeSink(api)
        for name, status in storespec.store_statuses(self.stores, labels).items():
            current = Observed.of(next(s for s in self.stores if s["metadata"]["name"] == name))
            ref = Ref(resource=MODELSTORES, name=name)
            desired = settle_conditions(Desired(status=status), current)
            await applying.apply_all(sink, plan(ref, desired, current), current)

    async def run(self, api: KubeClient, period_s: float, nodes: Informer) -> None:
        """:meth:`refresh` every ``period_s`` until cancelled (failures logged, retried)."""
        while True:
            try:
                await self.refresh(api, nodes)
            except errors.ApiError as e:
                log.warning("refreshing the ModelStores failed: %s", e)
            await anyio.sleep(period_s)

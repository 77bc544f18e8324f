"""Assembling ``worker.gpustack.ai/v1`` from what the worker holds, and keeping it fed.

:func:`build` makes the providers the API-serving core reads (:mod:`.providers`): with a
cluster, an informer per stored ``v1alpha1`` resource (every replica runs them: each answers
reads) and a delete that goes to the API; without one (``standalone``, ``--kubeconfig=none``),
the bus ledger (ModelArtifacts live in the API only, so that list is empty).
:meth:`WorkerGroup.run` runs the feeds until cancelled; :meth:`WorkerGroup.served` says whether
every source has its first full state, and :meth:`WorkerGroup.gate` answers the group's
discovery 503 until then: kube-apiserver's availability check reads it, so the APIService's
``Available`` turns true only once the group really serves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
from aiohttp import web

from controlplane import errors
from controlplane.chain.naming import INSTANCETYPEFLAVORS, INSTANCETYPES
from controlplane.extension.core.failures import ApiFailure, not_found
from controlplane.extension.core.model import Provider
from controlplane.extension.core.server import json_response
from controlplane.extension.workergroup import catalog
from controlplane.extension.workergroup.providers import (
    Downloads,
    InformerProvider,
    LedgerFeed,
    LedgerProvider,
)
from controlplane.k8s.client import KubeClient
from controlplane.k8s.informing import Informer
from controlplane.reconciling.nodestates import Ledger
from controlplane.resources import DEVICES, MODELARTIFACTS, NODEMODELSTORES, Ref, Resource
from kit.listening import Handler
from kit.tasks import start_forever

__all__ = ["STORED", "WorkerGroup", "build"]

STORED: Final[Mapping[str, Resource]] = {
    "devices": DEVICES,
    "nodemodelstores": NODEMODELSTORES,
    "modelartifacts": MODELARTIFACTS,
    "instancetypes": INSTANCETYPES,
    "instancetypeflavors": INSTANCETYPEFLAVORS,
}
"""Each served resource's stored ``v1alpha1`` resource."""


@dataclass
class WorkerGroup:
    providers: dict[str, Provider]
    informers: list[Informer] = field(default_factory=list)
    feed: LedgerFeed | None = None

    def served(self) -> bool:
        """True once every source holds its first full state."""
        return all(i.ready.is_set() for i in self.informers)

    async def run(self) -> None:
        """The feeds, until cancelled (informers retry by themselves)."""
        async with anyio.create_task_group() as tg:
            for informer in self.informers:
                start_forever(tg, f"v1-{informer.resource.plural}", informer.run)
            if self.feed is not None:
                start_forever(tg, "v1-ledger", self.feed.run)

    def gate(self, handlers: Mapping[str, Handler]) -> dict[str, Handler]:
        """``handlers`` with ``/apis/worker.gpustack.ai/v1`` answering 503 until :meth:`served`."""
        inner = handlers["/apis/{tail:.*}"]
        path = f"/apis/{catalog.GROUP_VERSION}"

        async def discovery(request: web.Request) -> web.StreamResponse:
            if not self.served():
                failure = ApiFailure(503, "ServiceUnavailable",
                                     f"{catalog.GROUP_VERSION} is starting: its caches have not "
                                     "listed yet")  # fmt: skip
                return json_response(503, failure.status())
            return await inner(request)

        return {path: discovery, path + "/": discovery, **handlers}


def build(
    *,
    api: KubeClient | None,
    ledger: Ledger,
    downloads: Downloads,
    relist_s: float = 0.0,
    spec_for: Callable[[str], dict[str, Any]] | None = None,
    period_s: float = 1.0,
) -> WorkerGroup:
    if api is None:
        feed = LedgerFeed(ledger, period_s=period_s,
                          **({"spec_for": spec_for} if spec_for else {}))  # fmt: skip
        return WorkerGroup(
            providers={n: LedgerProvider(n, feed) for n in catalog.RESOURCES}, feed=feed
        )
    informers = {n: Informer(api, STORED[n], resync_s=relist_s) for n in catalog.RESOURCES}

    def deleter(resource: str) -> Callable[[dict[str, Any]], Any] | None:
        if "delete" not in catalog.RESOURCES[resource].verbs:
            return None

        async def delete(obj: dict[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            ref = Ref(resource=STORED[resource], name=meta["name"],
                      namespace=meta.get("namespace") or None)  # fmt: skip
            try:
                await api.delete(ref)
            except errors.NotFound as e:
                raise not_found(catalog.GROUP, resource, ref.name) from e
            except errors.ApiError as e:
                raise ApiFailure(503, "ServiceUnavailable", f"cannot delete {ref}: {e}") from e

        return delete

    providers: dict[str, Provider] = {
        n: InformerProvider(
            n, i, deleter=deleter(n), downloads=downloads if n == "modelartifacts" else None
        )
        for n, i in informers.items()
    }
    return WorkerGroup(providers=providers, informers=list(informers.values()))

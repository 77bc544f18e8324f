"""Assembling ``worker.gpustack.ai/v1`` from what the worker holds, and keeping it fed.

:func:`build` makes one :class:`~.mirror.Mirror` per resource and its feed: with a cluster, an
informer per stored ``v1alpha1`` resource (every replica runs them: each answers reads) and a
delete that goes to the API; without one (``standalone``, ``--kubeconfig=none``), the bus
ledger, recomputed every ``period_s`` (ModelArtifacts live in the API only, so that mirror is
empty and ready). :meth:`WorkerGroup.run` runs the feeds until cancelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from controlplane import errors
from controlplane.chain.naming import INSTANCETYPEFLAVORS, INSTANCETYPES
from controlplane.extension.workergroup import catalog
from controlplane.extension.workergroup.feeds import InformerFeed, LedgerFeed
from controlplane.extension.workergroup.listing import Invalid
from controlplane.extension.workergroup.mirror import Mirror
from controlplane.extension.workergroup.serving import Downloads, WorkerGroupApi
from controlplane.k8s.client import KubeClient
from controlplane.k8s.informing import Informer
from controlplane.reconciling.ledger import Ledger
from controlplane.resources import DEVICES, MODELARTIFACTS, NODEMODELSTORES, Ref, Resource
from kit.tasks import start_forever

__all__ = ["STORED", "WorkerGroup", "build"]

STORED: dict[str, Resource] = {
    "devices": DEVICES,
    "nodemodelstores": NODEMODELSTORES,
    "modelartifacts": MODELARTIFACTS,
    "instancetypes": INSTANCETYPES,
    "instancetypeflavors": INSTANCETYPEFLAVORS,
}
"""Each served resource's stored ``v1alpha1`` resource."""


@dataclass
class WorkerGroup:
    api: WorkerGroupApi
    mirrors: dict[str, Mirror]
    informers: list[Informer] = field(default_factory=list)
    ledger_feed: LedgerFeed | None = None

    async def run(self) -> None:
        """The feeds, until cancelled (informers retry by themselves)."""
        async with anyio.create_task_group() as tg:
            for informer in self.informers:
                start_forever(tg, f"v1-{informer.resource.plural}", informer.run)
            if self.ledger_feed is not None:
                start_forever(tg, "v1-ledger", self.ledger_feed.run)


def build(
    *,
    api: KubeClient | None,
    ledger: Ledger,
    downloads: Downloads,
    relist_s: float = 0.0,
    spec_for: Callable[[str], dict[str, Any]] | None = None,
    period_s: float = 1.0,
) -> WorkerGroup:
    mirrors = {name: Mirror() for name in catalog.RESOURCES}
    if api is None:
        feed = LedgerFeed(ledger, {n: m for n, m in mirrors.items() if n != "modelartifacts"},
                          period_s=period_s, **({"spec_for": spec_for} if spec_for else {}))  # fmt: skip
        mirrors["modelartifacts"].replace([], 0)
        served = WorkerGroupApi(
            mirrors=mirrors, sync=lambda: None, downloads=downloads,
        )  # fmt: skip
        return WorkerGroup(api=served, mirrors=mirrors, ledger_feed=feed)
    informers = [Informer(api, STORED[n], resync_s=relist_s) for n in catalog.RESOURCES]
    feeds = [InformerFeed(i, mirrors[n]) for n, i in zip(catalog.RESOURCES, informers, strict=True)]

    def sync() -> None:
        for f in feeds:
            f.sync()

    async def delete(resource: str, namespace: str, name: str) -> None:
        ref = Ref(resource=STORED[resource], name=name, namespace=namespace or None)
        try:
            await api.delete(ref)
        except errors.NotFound as e:
            raise Invalid(404, "NotFound", f'{resource}.{catalog.GROUP} "{name}" not found') from e
        except errors.ApiError as e:
            raise Invalid(503, "ServiceUnavailable", f"cannot delete {ref}: {e}") from e

    served = WorkerGroupApi(
        mirrors=mirrors, sync=sync, downloads=downloads, deleter=delete,
    )  # fmt: skip
    return WorkerGroup(api=served, mirrors=mirrors, informers=informers)

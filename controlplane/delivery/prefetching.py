"""The ModelPrefetch reconciler: warm-up Pods created and deleted, status written, pins handed on.

Leader only. One :meth:`Prefetcher.refresh` lists the prefetches and what they name (artifacts,
bindings, ModelStores, Nodes, InstanceTypes, and each namespace's Pods once), decides every
prefetch with :func:`controlplane.stores.prefetches.decide` and applies the plan: Pods
created (an existing one of that name is left alone) and deleted (an absent one is fine),
status patched when it differs. The pins of every prefetch are gathered per node; a node whose
pins changed is handed to ``on_pins`` (the node reconciler rewrites its NodeModelStore
``spec.pinned``, which the node's agent never collects).

Warm-up Pods are owned by their ModelPrefetch (``ownerReferences``), so deleting a prefetch
lets Kubernetes' garbage collector remove them even while the worker is down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from controlplane import errors
from controlplane.chain.naming import INSTANCETYPES
from controlplane.delivery.metering import list_or_none, node_labels, without_times
from controlplane.k8s.client import KubeClient
from controlplane.k8s.informing import Informer
from controlplane.reconciling.nodestates import Ledger
from controlplane.resources import (
    MODELARTIFACTS,
    MODELPREFETCHES,
    MODELSTOREBINDINGS,
    MODELSTORES,
    PODS,
    Ref,
)
from controlplane.stores import bindings, prefetches
from kit.latest import Latest

__all__ = ["Prefetcher"]

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "gpustack/mirrored-python:3.12-alpine"

Key = tuple[str, str]


def _by_key(objs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    return {(o["metadata"].get("namespace") or "", o["metadata"]["name"]): o for o in objs}


class Prefetcher:
    """The prefetches' pins as last decided (node -> digests)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        pins: Latest[str, tuple[str, ...]] | None = None,
        image: Callable[[], str] = lambda: DEFAULT_IMAGE,
        on_pins: Callable[[str], None] = lambda _node: None,
    ) -> None:
        """``pins`` is where the decided pins go (made first, its ``get`` given to the
        ModelStores); ``on_pins`` is told each node whose pins changed."""
        self._ledger = ledger
        self._image = image
        self._on_pins = on_pins
        self._pins: Latest[str, tuple[str, ...]] = pins if pins is not None else Latest(())

    def pins(self, node: str) -> tuple[str, ...]:
        """The digests prefetches pin on ``node`` (sorted; empty: none)."""
        return self._pins.get(node)

    async def refresh(self, api: KubeClient, nodes: Informer | None = None) -> None:
        """Decide every prefetch and apply the plans (see the module's docstring)."""
        found = await list_or_none(api, MODELPREFETCHES)
        pins: dict[str, set[str]] = {}
        if found:
            situation = await self._situation(api, nodes, found)
            for mpf in found:
                plan = prefetches.decide(situation(mpf), self._image(), _now_text())
                try:
                    await self._apply(api, mpf, plan)
                except errors.ApiError as e:  # one refused write stops only its own prefetch
                    meta = mpf["metadata"]
                    log.warning("modelprefetch %s/%s: %s", meta.get("namespace"), meta["name"], e)
                for node, digest in plan.pins.items():
                    pins.setdefault(node, set()).add(digest)
        self._hand_on({n: tuple(sorted(d)) for n, d in pins.items()})

    async def _situation(
        self, api: KubeClient, nodes: Informer | None, found: list[dict[str, Any]]
    ) -> Callable[[dict[str, Any]], prefetches.Situation]:
        """What every decision reads, listed once; the result builds one prefetch's view."""
        artifacts = _by_key(await list_or_none(api, MODELARTIFACTS))
        binds = _by_key(await list_or_none(api, MODELSTOREBINDINGS))
        labels = await node_labels(api, nodes)
        node_store = bindings.node_stores(await list_or_none(api, MODELSTORES), labels)
        types = {t["metadata"]["name"]: t for t in await list_or_none(api, INSTANCETYPES)}
        namespaces = {m["metadata"].get("namespace") or "" for m in found}
        pods = {ns: await api.list(PODS, ns) for ns in sorted(namespaces)}
        models = {n: s.models for n in self._ledger.nodes() if (s := self._ledger.get(n))}
        now = datetime.now(UTC)

        def situation(mpf: dict[str, Any]) -> prefetches.Situation:
            meta, spec = mpf["metadata"], mpf.get("spec") or {}
            ns, uid = meta.get("namespace") or "", meta.get("uid") or ""
            own = [
                p
                for p in pods.get(ns, [])
                if uid and (p["metadata"].get("labels") or {}).get(prefetches.POD_LABEL) == uid
            ]
            return prefetches.Situation(
                prefetch=mpf,
                artifact=artifacts.get((ns, (spec.get("artifactRef") or {}).get("name", ""))),
                binding=binds.get((ns, (spec.get("bindingRef") or {}).get("name", ""))),
                nodes=labels, node_store=node_store, instance_types=types, models=models,
                pods=own, now=now,
            )  # fmt: skip

        return situation

    async def _apply(self, api: KubeClient, mpf: dict[str, Any], plan: prefetches.Plan) -> None:
        ns, name = mpf["metadata"].get("namespace") or "", mpf["metadata"]["name"]
        for pod_name in plan.delete:
            try:
                await api.delete(Ref(resource=PODS, name=pod_name, namespace=ns))
            except errors.NotFound:
                pass
        for pod in plan.create:
            try:
                await api.create(
                    Ref(resource=PODS, name=pod["metadata"]["name"], namespace=ns), pod
                )
            except errors.Conflict:
                pass  # made by an earlier round and not listed yet
        if without_times(mpf.get("status")) != without_times(plan.status):
            ref = Ref(resource=MODELPREFETCHES, name=name, namespace=ns)
            await api.patch(ref, {"status": plan.status}, subresource="status")

    def _hand_on(self, fresh: dict[str, tuple[str, ...]]) -> None:
        for node in self._pins.replace(fresh):
            self._on_pins(node)

    async def run(self, api: KubeClient, period_s: float, nodes: Informer | None) -> None:
        """:meth:`refresh` every ``period_s`` until cancelled (failures logged, retried)."""
        while True:
            try:
                await self.refresh(api, nodes)
            except errors.ApiError as e:
                log.warning("reconciling the ModelPrefetches failed: %s", e)
            await anyio.sleep(period_s)


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

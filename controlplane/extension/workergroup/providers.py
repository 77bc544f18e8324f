"""What backs ``worker.gpustack.ai/v1`` in the API-serving core: one provider per resource.

- :class:`InformerProvider` (with a cluster): the objects of one
  :class:`~controlplane.k8s.informing.Informer` of the stored ``v1alpha1`` resource, as v1
  views, read from memory (no API request per read), at the API server's resourceVersions (the
  objects' own, and the informer's for the collection), so every replica serves the same
  versions; every change the informer applies wakes the watches. Before the informer's first list it answers 503: the group is not served yet.
  A delete goes to the stored object; ``modelartifacts/progress`` is computed per request from
  the nodes' download state (:mod:`.progress`).
- :class:`LedgerFeed` and :class:`LedgerProvider` (``standalone``, ``--kubeconfig=none``): the
  bodies computed from the bus ledger with the reconcilers' own pure functions (``Devices``,
  ``NodeModelStore``, and the scheduling chain's plan for ``InstanceType`` and
  ``InstanceTypeFlavor``), recomputed every ``period_s`` and on each read. Condition timestamps
  are stamped at each computation, so a body equal but for them is kept as it was: an
  unchanged node is no change, and watches are woken only by real ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio

from bus import events
from controlplane.chain import inventory
from controlplane.chain.kueue import plan_chain
from controlplane.chain.settings import ChainSettings
from controlplane.extension.core.failures import ApiFailure
from controlplane.extension.workergroup import catalog, progress
from controlplane.k8s.informing import Informer
from controlplane.reconciling import objects as bodies
from controlplane.reconciling.nodestates import Ledger, NodeState
from controlplane.reconciling.planning import Desired

__all__ = ["Changes", "InformerProvider", "LedgerFeed", "LedgerProvider", "ledger_bodies"]

Deleter = Callable[[dict[str, Any]], Awaitable[None]]
Downloads = Callable[[], Iterable[tuple[str, tuple[events.ModelState, ...] | None]]]


def _refused(what: str) -> ApiFailure:
    return ApiFailure(405, "MethodNotAllowed", f"{what} cannot be written here")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Changes:
    """Wakes every watcher of one source after each change (never blocks the teller). A change
    told while a follower is busy is not lost: each follower compares a change count."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self.count = 0

    def tell(self, *_: object) -> None:
        self.count += 1
        self._event.set()
        self._event = anyio.Event()

    @asynccontextmanager
    async def follow(self) -> AsyncIterator[AsyncIterator[object]]:
        seen = self.count  # from entering: a change before the first iteration counts

        async def iterate() -> AsyncIterator[object]:
            nonlocal seen
            while True:
                while self.count == seen:
                    await self._event.wait()
                seen = self.count
                yield None

        yield iterate()


class _Reads:
    """The provider methods every read-only resource here shares."""

    _name: str
    _deleter: Deleter | None = None
    _downloads: Downloads | None = None

    async def write(
        self, old: dict[str, Any] | None, new: dict[str, Any], user: str
    ) -> Sequence[str]:
        raise _refused(self._name)

    async def delete(self, obj: dict[str, Any], user: str) -> None:
        if self._deleter is None:
            raise _refused(self._name)
        await self._deleter(obj)

    async def subresource(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        if name != "progress" or self._downloads is None:
            raise ApiFailure(404, "NotFound", f"{self._name} have no subresource {name!r}")
        return progress.progress(obj, self._downloads(), now=_now())


class InformerProvider(_Reads):
    """One served resource from its informer (see the module docstring)."""

    def __init__(
        self,
        name: str,
        informer: Informer,
        *,
        deleter: Deleter | None = None,
        downloads: Downloads | None = None,
    ) -> None:
        self._name, self.informer = name, informer
        self._deleter, self._downloads = deleter, downloads
        self._changes = Changes()
        self._views: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        """Informer key -> (its body, the view handed out): an unchanged body (the informer
        replaces, never edits, one) gets the same view, which the core takes as unchanged
        without comparing."""
        informer.listen(self._changes.tell)

    @property
    def ready(self) -> bool:
        return self.informer.ready.is_set()

    async def objects(self) -> list[dict[str, Any]]:
        if not self.ready:
            raise ApiFailure(503, "ServiceUnavailable",
                             f"{self._name}: the cache has not listed yet")  # fmt: skip
        views: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        for key, body in self.informer.objects.items():
            held = self._views.get(key)
            views[key] = (
                held if held is not None and held[0] is body else (body, catalog.view(body))
            )
        self._views = views
        return [v for _, v in views.values()]

    def changes(self) -> Any:
        return self._changes.follow()

    def version(self) -> int | None:
        """The informer's collection version (the API server's: the same on every replica)."""
        text = self.informer.resource_version
        return int(text) if text.isdigit() else None


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
        devices, _ = bodies.devices(node, None, state)
        if devices is not None:
            out["devices"].append(_stamp("Devices", node, devices))
        store = bodies.node_model_store(node, None, state, spec_for(node))
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
    """``value`` without ``lastTransitionTime`` and creation time (how bodies are compared)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items()
                if k not in ("lastTransitionTime", "creationTimestamp")}  # fmt: skip
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


class LedgerFeed:
    """The ledger's bodies per resource, kept stable (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        spec_for: Callable[[str], dict[str, Any]] = lambda _node: bodies.NMS_SPEC_DEFAULT,
        period_s: float = 1.0,
    ) -> None:
        self._ledger, self._spec_for, self._period_s = ledger, spec_for, period_s
        self.held: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in catalog.RESOURCES}
        self.changes = Changes()

    def sync(self) -> None:
        """One computation; what differs (timestamps aside) replaces what is held."""
        changed = False
        for resource, made in ledger_bodies(self._ledger, self._spec_for).items():
            held = self.held[resource]
            fresh: dict[str, dict[str, Any]] = {}
            for body in made:
                name = body["metadata"]["name"]
                old = held.get(name)
                if old is not None and _timeless(old) == _timeless(body):
                    fresh[name] = old
                    continue
                created = (old or {}).get("metadata", {}).get("creationTimestamp") or _now()
                fresh[name] = {**body, "metadata": {**body["metadata"],
                                                    "creationTimestamp": created}}  # fmt: skip
                changed = True
            changed = changed or fresh.keys() != held.keys()
            self.held[resource] = fresh
        if changed:
            self.changes.tell()

    async def run(self) -> None:
        while True:
            self.sync()
            await anyio.sleep(self._period_s)


class LedgerProvider(_Reads):
    """One resource of :class:`LedgerFeed` (``modelartifacts`` is always empty: no API)."""

    def __init__(self, name: str, feed: LedgerFeed) -> None:
        self._name, self._feed = name, feed

    async def objects(self) -> list[dict[str, Any]]:
        self._feed.sync()
        return list(self._feed.held[self._name].values())

    def changes(self) -> Any:
        return self._feed.changes.follow()

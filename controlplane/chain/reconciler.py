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

- write only on change: every object is planned by :func:`controlplane.reconciling.planning.plan`
  (whose one key rule never removes what Kueue or the API server defaulted) and written by the
  one executor, :mod:`controlplane.reconciling.applying`; an unchanged plan writes nothing;
- created before referenced, deleted after unreferenced, only owned objects deleted
  (:mod:`~controlplane.chain.converging`); InstanceTypes are never deleted (create-only);
- Kueue's CRDs absent (404 on a collection): the Kueue part waits ``retry_s``, doubling up to
  ``retry_cap_s``, logged at each try; InstanceTypes and labels go on. Any API error drops the
  cache (the next tick lists again and looks at every node) and never stops the loop;
- no plan from an empty cache: passes wait for the informer's first list;
- a node whose own reconcile is queued or running (``labels_due``) is not patched: that
  reconcile's one Node patch carries the chain's labels (:meth:`ChainReconciler.label_patch`),
  and the node stays dirty until the chain has looked at it with nothing left to write;
- a node is looked at again when its Node or its ledger state changed, and every node at least
  every ``period_s``; a pass whose nodes' signatures all compare equal plans nothing.

The class keeps only the loop and the state between passes (dirty nodes, what each node gave,
the last plan); what was listed, when to list again and the Kueue wait are
:mod:`~controlplane.chain.listing`'s; its decisions are pure: node labels in :mod:`~controlplane.chain.nodelabels`, the pass's plan,
statuses and activation in :mod:`~controlplane.chain.deciding`. Other components read its results
through read-only accessors (:attr:`ChainReconciler.nodes`, :attr:`~ChainReconciler.flavor_nodes`,
:meth:`~ChainReconciler.entrance`) and change its settings only through :meth:`retune`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import anyio
import anyio.lowlevel

from bus import events
from controlplane import errors
from controlplane.chain import converging, deciding, naming, nodelabels
from controlplane.chain.deciding import PassPlan
from controlplane.chain.inventory import NodeFacts, facts_of
from controlplane.chain.listing import Listed
from controlplane.chain.settings import ChainSettings
from controlplane.k8s.client import KubeClient
from controlplane.k8s.informing import Informer
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling import applying
from controlplane.reconciling.nodestates import Ledger, NodeState
from controlplane.reconciling.planning import Patch
from controlplane.reconciling.sinks import KubeSink
from controlplane.resources import NODES, Ref

__all__ = ["ChainReconciler"]

log = logging.getLogger(__name__)


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
        labels_due: Callable[[str], bool] | None = None,
    ) -> None:
        self._sink = KubeSink(api)
        self._ledger = ledger
        self._nodes = nodes
        nodes.listen(self.node_changed)
        self._dirty: set[str] = set()
        """Nodes to look at again (bounded by the node count); swapped out by each pass."""
        self._lists_seen = -1
        """The informer's list count at the last full pass: another list means a full pass."""
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._wallclock = wallclock
        self._listed = Listed(api, settings, clock)
        """The cache of the chain's objects and the wait for Kueue (:mod:`.listing`)."""
        self._last: PassPlan | None = None
        """The last pass's plan (what the accessors answer from)."""
        self._replan = False
        """A write this pass changes the next plan (a check turned Active): plan again."""
        self._seen: dict[str, tuple[tuple[Any, ...], NodeFacts | None]] = {}
        """Per node: the signature last reconciled and the facts it gave."""
        self._labels_due = labels_due
        """A node reconcile that patches this Node is queued or running
        (:class:`~controlplane.reconciling.processing.LabelsDue`): it carries our labels too."""

    @property
    def settings(self) -> ChainSettings:
        return self._settings

    def retune(self, settings: ChainSettings) -> None:
        """Use ``settings`` from the next pass on (a Settings object changed)."""
        self._settings = settings

    @property
    def kueue_present(self) -> bool:
        """Kueue's CRDs answered the last list."""
        return self._listed.kueue_present

    @property
    def nodes(self) -> Mapping[str, NodeFacts]:
        """Managed nodes as last planned (the admission check reads them)."""
        return self._last.managed if self._last is not None else {}

    @property
    def flavor_nodes(self) -> Mapping[str, list[str]]:
        """ResourceFlavor name -> the managed nodes it selects, as last planned."""
        return self._last.flavor_nodes if self._last is not None else {}

    def entrance(self, local_queue: str) -> str | None:
        """The accelerator group of a LocalQueue of the last plan (the Workload webhook)."""
        return self._last.plan.entrances.get(local_queue) if self._last is not None else None

    def label_patch(
        self, body: Mapping[str, Any], state: NodeState | None
    ) -> dict[str, str | None]:
        """The chain's labels that differ on ``body`` (the node reconciler sends them with its
        own patch: :class:`~controlplane.reconciling.nodes.NodeLabeller`)."""
        return nodelabels.label_patch(body, state, self._settings).patch

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
                    "scheduling chain: %s; listing again in %.1fs", e, self._settings.retry_s
                )
                self._listed.drop()
                self._seen.clear()
                await anyio.sleep(self._settings.retry_s)
                continue
            await anyio.sleep(self._settings.fit_coalesce_s)

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
        if self._listed.due(started, self._settings.period_s):
            await self._listed.refresh(self._settings)
            changed = full = True
        self._lists_seen = self._nodes.lists
        changed = await self._look_at_nodes(full) or changed
        if changed:
            await self._converge()
        if self._metrics is not None:
            self._metrics.reconcile_seconds.labels(kind="chain").observe(self._clock() - started)

    async def _converge(self) -> None:
        """Plan from the managed nodes and the cache, then write what differs."""
        cache = self._listed.cache
        assert cache is not None  # listed first by the same pass, or by an earlier one
        managed = [
            facts
            for name in self._nodes.objects
            if (seen := self._seen.get(name)) is not None and (facts := seen[1]) is not None
        ]
        self._last = deciding.plan_pass(managed, self._ledger.get, cache, self._settings)
        plan = self._last.plan
        now = self._wallclock().strftime("%Y-%m-%dT%H:%M:%SZ")
        await converging.converge_instance_types(self._sink, plan, cache, now)
        await converging.converge_set(self._sink, naming.INSTANCETYPEFLAVORS, plan.catalog, cache)
        if self._listed.kueue_present and await converging.converge_kueue(
            self._sink, plan, cache, now
        ):
            self._replan = True  # the queues list the check once it is Active

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

    def _signature(self, body: Mapping[str, Any]) -> tuple[Any, ...]:
        return nodelabels.signature(
            body, self._ledger.get(body["metadata"]["name"]), self._settings
        )

    async def _label_node(self, body: dict[str, Any]) -> bool:
        """Patch the node's labels where they differ (:func:`nodelabels.label_patch`); whether
        anything about the node changed (its facts are in :attr:`_seen`)."""
        name = body["metadata"]["name"]
        signature = self._signature(body)
        known = self._seen.get(name)
        if known is not None and known[0] == signature:
            return False
        state = self._ledger.get(name)
        decided = nodelabels.label_patch(body, state, self._settings)
        facts = decided.facts
        if decided.patch and self._labels_due is not None and self._labels_due(name):
            # The node reconciler writes these labels with its own in a moment: look again next
            # pass (its answer is in the informer then), planning meanwhile with these facts.
            self._dirty.add(name)
            deferred = ((), facts)
            changed = self._seen.get(name) != deferred
            self._seen[name] = deferred
            return changed
        if decided.patch:
            ref = Ref(resource=NODES, name=name)
            patch = Patch(ref=ref, body={"metadata": {"labels": decided.patch}}, precondition=False)
            written = await applying.apply(self._sink, patch, None)
            assert written is not None
            body = written.body
            self._nodes.put(body)  # its watch echo has this resourceVersion: no change
            if facts is not None:
                facts = facts_of(body, self._ledger.get(name))
        self._seen[name] = (self._signature(body), facts)
        return True

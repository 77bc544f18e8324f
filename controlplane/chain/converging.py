"""The chain's writes: each object planned by :func:`controlplane.reconciling.planning.plan`
(the one key rule) and written by :func:`controlplane.reconciling.applying.apply` (the one
executor). Only I/O and the cache bookkeeping live here; the decisions are in
:mod:`~controlplane.chain.deciding` and :mod:`~controlplane.chain.kueue`.

Invariants: created before referenced and deleted after unreferenced (Topologies,
AdmissionChecks, flavors, ClusterQueues, LocalQueues in that order; deletions in reverse); only
owned objects are deleted (:func:`deciding.owned`); the cache holds what the API returned; a
create that finds the object made meanwhile adopts it (the next pass patches it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from controlplane import errors
from controlplane.chain import deciding, naming
from controlplane.chain.deciding import Cache
from controlplane.chain.kueue import ChainPlan
from controlplane.reconciling import applying
from controlplane.reconciling.planning import Action, Delete, Desired, Patch, plan
from controlplane.reconciling.sinks import Sink
from controlplane.resources import Observed, Ref, Resource

__all__ = ["converge_instance_types", "converge_kueue", "converge_set", "delete_unwanted", "write"]

log = logging.getLogger(__name__)

_DELETE_ORDER: Final = tuple(reversed(naming.KUEUE_KINDS))


async def write(
    sink: Sink, ref: Ref, desired: Desired, body: dict[str, Any] | None
) -> dict[str, Any]:
    """Make the object at ``ref`` (``body`` as last seen, ``None``: absent) match ``desired``;
    the body it now has."""
    current = Observed.of(body) if body is not None else None
    return await _perform(sink, ref, plan(ref, desired, current), current)


async def _perform(
    sink: Sink, ref: Ref, actions: list[Action], current: Observed | None
) -> dict[str, Any]:
    for action in actions:
        try:
            current = await applying.apply(sink, action, current)
        except errors.Conflict:
            if current is not None or (found := await sink.get(ref)) is None:
                raise
            return found.body  # made meanwhile: the next pass patches it
    assert current is not None  # a create or a patch, never a delete
    return current.body


async def converge_instance_types(sink: Sink, plan_: ChainPlan, cache: Cache, now: str) -> None:
    """Create the derived InstanceTypes that are absent (never overwritten), then write every
    status that changed, logging each condition once, when it changes."""
    observed = cache[naming.INSTANCETYPES]
    for name, desired in plan_.instance_types.items():
        ref = Ref(resource=naming.INSTANCETYPES, name=name)
        if ref not in observed:
            observed[ref] = await write(sink, ref, desired, None)
    for ref, status in deciding.statuses(plan_, observed, now).items():
        current = Observed.of(observed[ref])
        actions = plan(ref, status, current)
        for action in actions:
            conditions = action.body["status"] if isinstance(action, Patch) else {}
            for condition in conditions.get("conditions") or []:
                log.warning("InstanceType %s: %s: %s", ref.name, condition["reason"],
                            condition.get("message", ""))  # fmt: skip
        observed[ref] = await _perform(sink, ref, actions, current)


async def converge_set(
    sink: Sink,
    resource: Resource,
    desired: Mapping[str, Desired] | Mapping[Ref, Desired],
    cache: Cache,
    *,
    delete: bool = True,
) -> None:
    """Create or patch every desired object of ``resource``; delete the owned others."""
    observed = cache.setdefault(resource, {})
    wanted: dict[Ref, Desired] = {
        (k if isinstance(k, Ref) else Ref(resource=resource, name=k)): v for k, v in desired.items()
    }
    for ref, want in wanted.items():
        observed[ref] = await write(sink, ref, want, observed.get(ref))
    if delete:
        await delete_unwanted(sink, wanted, observed)


async def delete_unwanted(
    sink: Sink, wanted: Mapping[Ref, Any], observed: dict[Ref, dict[str, Any]]
) -> None:
    for ref, body in list(observed.items()):
        if ref not in wanted and deciding.owned(body):
            await applying.apply(sink, Delete(ref=ref), Observed.of(body))
            observed.pop(ref, None)


async def converge_kueue(sink: Sink, plan_: ChainPlan, cache: Cache, now: str) -> bool:
    """The Kueue objects in creation order, then deletions in reverse; whether the check was
    made Active (the queues list it once it is: plan again)."""
    activated = False
    for resource in naming.KUEUE_KINDS:
        part = {r: d for r, d in plan_.kueue.items() if r.resource == resource}
        await converge_set(sink, resource, part, cache, delete=False)
        if resource == naming.ADMISSIONCHECKS:
            activated = await _activate(sink, cache[resource], now)
    for resource in _DELETE_ORDER:
        part = {r: d for r, d in plan_.kueue.items() if r.resource == resource}
        await delete_unwanted(sink, part, cache.setdefault(resource, {}))
    return activated


async def _activate(sink: Sink, checks: dict[Ref, dict[str, Any]], now: str) -> bool:
    """Set ``Active`` on the check this process controls (an ACC's duty)."""
    wanted = deciding.activation(checks, now)
    if wanted is None:
        return False
    ref, desired = wanted
    checks[ref] = await write(sink, ref, desired, checks[ref])
    return True

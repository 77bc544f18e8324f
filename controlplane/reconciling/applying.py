"""The one executor of planned writes: :func:`apply` performs an :class:`~.planning.Action`.

Every reconciler decides with :func:`controlplane.reconciling.planning.plan` (pure, synchronous)
and writes through here: the node reconciler (Devices, NodeModelStore, Node keys), the
ModelArtifact status writer, and the scheduling chain (InstanceTypes, flavors, Kueue objects,
Node labels). This module does only I/O and decides nothing, so the rules of what is written
live in one place (:mod:`.planning`'s docstring) and cannot drift between two engines.

Invariants:

- a :class:`~.planning.Patch` with ``precondition`` carries the ``resourceVersion`` of the
  object it was planned against (a stale plan is a 409, never a lost update); without one (a
  Node, which the kubelet rewrites all the time) it carries none;
- the result is the object as the sink returned it (``None`` after a delete), so a caller's
  cache holds what was written, never what was meant;
- errors are the sink's (:mod:`controlplane.errors`), raised unchanged: what a conflict means
  (re-read and re-plan, or adopt what another writer made) is the caller's decision.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.reconciling.planning import Action, Create, Delete, Patch
from controlplane.reconciling.sinks import Sink
from controlplane.resources import Observed

__all__ = ["apply", "apply_all"]


async def apply(sink: Sink, action: Action, current: Observed | None) -> Observed | None:
    """Perform ``action`` against ``sink``; ``current`` is the object it was planned against.

    :returns: the object as the sink now holds it; ``None`` after a delete.
    """
    ref = action.ref
    if isinstance(action, Create):
        return await sink.create(ref, action.body)
    if isinstance(action, Patch):
        body = action.body
        if action.precondition and current is not None:
            meta = {**body.get("metadata", {}), "resourceVersion": current.resource_version}
            body = {**body, "metadata": meta}
        return await sink.patch(ref, body, subresource=action.subresource)
    if isinstance(action, Delete):
        await sink.delete(ref)
        return None
    raise TypeError(f"not an action: {action!r}")  # pragma: no cover - Action is closed


async def apply_all(
    sink: Sink, actions: Sequence[Action], current: Observed | None
) -> Observed | None:
    """Perform one object's ``actions`` in order, each against the result of the one before."""
    for action in actions:
        current = await apply(sink, action, current)
    return current

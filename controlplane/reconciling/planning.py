"""``plan(desired, observed) -> actions``: the decisions of every reconciler, pure and synchronous.

An object the control plane owns (``Devices``, ``NodeModelStore``, the ledger records of the KV
sink, the chain's InstanceTypes, flavors and Kueue objects) is described by :class:`Desired`:
the metadata it owns, its ``spec`` and its ``status``. Planning compares that with what the sink
last returned and emits the fewest writes, which :mod:`controlplane.reconciling.applying` (the one
executor) performs:

- nothing when every owned field already matches (write only on change);
- a create (without status: the status subresource ignores it), then a status patch;
- a merge patch of ``spec``/owned metadata, and a separate merge patch of ``status``;
- a delete when the object should not exist.

**The one rule for keys** (:func:`merge_patch`, RFC 7386 patches): a key the desired part names
is set when it differs (a dict merged key by key by this same rule, a list or scalar replaced
whole); a key named with ``None`` is removed when present (and a ``None`` inside a new value is
dropped: there is nothing to remove). A key the desired part does *not* name is **left alone**,
because the API server defaults fields (Kueue's ClusterQueue ``queueingStrategy``, the
NodeModelStore's watermarks) and other writers own theirs: removing what we did not name would
fight the defaulting with a write every pass. The one exception is declared, never implied: a
part listed in :attr:`Desired.whole` (the ``status`` the controller alone writes, a ``spec``
rebuilt whole by a three-way merge) is owned whole, so the keys it no longer names are removed
(a finished download's ``downloading``, a proxy taken out of the settings). ``metadata`` is
never owned whole (labels and annotations are shared).

The executor adds the ``resourceVersion`` precondition; a Node is patched without one because
the kubelet updates it all the time and only owned keys are touched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec

from controlplane.resources import Observed, Ref

__all__ = [
    "WHOLE",
    "Action",
    "Create",
    "Delete",
    "Desired",
    "Part",
    "Patch",
    "merge_patch",
    "plan",
    "plan_node",
    "settle_conditions",
]


Part = Literal["spec", "status"]
WHOLE: frozenset[Part] = frozenset(("spec", "status"))
"""Both parts owned whole: objects nobody else writes and the server does not default."""


class Create(msgspec.Struct, frozen=True, kw_only=True):
    ref: Ref
    body: dict[str, Any]


class Patch(msgspec.Struct, frozen=True, kw_only=True):
    ref: Ref
    body: dict[str, Any]
    subresource: str | None = None
    precondition: bool = True


class Delete(msgspec.Struct, frozen=True, kw_only=True):
    ref: Ref


Action = Create | Patch | Delete


class Desired(msgspec.Struct, frozen=True, kw_only=True):
    """What one owned object should look like. ``None`` parts are not owned (left alone)."""

    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    """Owned metadata beside the name, e.g. ``ownerReferences`` and ``labels``."""
    spec: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    whole: frozenset[Part] = frozenset()
    """The parts owned whole: a key they do not name is removed (see the module docstring)."""


def merge_patch(current: Any, desired: Any, *, whole: bool = False) -> Any:
    """The merge patch making ``current`` match ``desired`` by the module's one rule (``{}``:
    nothing differs). ``whole``: keys ``desired`` does not name are removed too, at every depth.
    """
    if not isinstance(desired, dict) or not isinstance(current, dict):
        return clean(desired)
    out: dict[str, Any] = {k: None for k in current if k not in desired} if whole else {}
    for key, value in desired.items():
        if value is None:
            if key in current:
                out[key] = None
        elif isinstance(value, dict) and isinstance(current.get(key), dict):
            sub = merge_patch(current[key], value, whole=whole)
            if sub:
                out[key] = sub
        elif key not in current or current[key] != value:
            out[key] = clean(value)
    return out


def clean(value: Any) -> Any:
    """A value to write where nothing is: ``None`` members of its dicts are dropped."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if v is not None}
    return value


def settle_conditions(desired: Desired, observed: Observed | None) -> Desired:
    """``desired`` with each condition's ``lastTransitionTime`` taken from the observed object
    when that condition's ``status`` did not change.

    Invariant: ``lastTransitionTime`` moves only on a status flip (or a new condition), so an
    otherwise unchanged status plans no write however often it is recomputed.
    """
    conditions = (desired.status or {}).get("conditions")
    current = ((observed.body.get("status") or {}) if observed is not None else {}).get(
        "conditions"
    )
    if not conditions or not isinstance(current, list):
        return desired
    before = {c.get("type"): c for c in current if isinstance(c, dict)}
    settled = []
    for c in conditions:
        old = before.get(c.get("type"))
        if old is not None and old.get("status") == c.get("status") and "lastTransitionTime" in old:
            c = {**c, "lastTransitionTime": old["lastTransitionTime"]}
        settled.append(c)
    status = {**(desired.status or {}), "conditions": settled}
    return msgspec.structs.replace(desired, status=status)


def plan(
    ref: Ref,
    desired: Desired | None,
    observed: Observed | None,
    *,
    status_on_create: bool = False,
) -> list[Action]:
    """The writes that make the object at ``ref`` match ``desired`` (``None``: must not exist).

    ``status_on_create``: the sink keeps ``status`` on create, so a new object is one write.
    """
    if desired is None:
        return [] if observed is None else [Delete(ref=ref)]
    if observed is None:
        body: dict[str, Any] = {
            "apiVersion": ref.resource.api_version,
            "kind": ref.resource.kind,
            "metadata": {"name": ref.name, **clean(desired.metadata)},
        }
        if ref.namespace:
            body["metadata"]["namespace"] = ref.namespace
        if desired.spec is not None:
            body["spec"] = clean(desired.spec)
        status = clean(desired.status) if desired.status is not None else None
        if status_on_create and status is not None:
            body["status"] = status
            return [Create(ref=ref, body=body)]
        actions: list[Action] = [Create(ref=ref, body=body)]
        if status is not None:
            actions.append(Patch(ref=ref, body={"status": status}, subresource="status"))
        return actions
    return _plan_update(ref, desired, observed.body)


def _plan_update(ref: Ref, desired: Desired, current: dict[str, Any]) -> list[Action]:
    actions: list[Action] = []
    main: dict[str, Any] = {}
    meta = merge_patch(current.get("metadata") or {}, desired.metadata)
    if meta:
        main["metadata"] = meta
    if desired.spec is not None:
        spec = merge_patch(current.get("spec") or {}, desired.spec, whole="spec" in desired.whole)
        if spec:
            main["spec"] = spec
    if main:
        actions.append(Patch(ref=ref, body=main))
    if desired.status is not None:
        whole = "status" in desired.whole
        status = merge_patch(current.get("status") or {}, desired.status, whole=whole)
        if status:
            actions.append(Patch(ref=ref, body={"status": status}, subresource="status"))
    return actions


def _owned_diff(
    current: dict[str, str], desired: dict[str, str], owned: Callable[[str], bool]
) -> dict[str, str | None]:
    out: dict[str, str | None] = {k: None for k in current if owned(k) and k not in desired}
    out.update({k: v for k, v in desired.items() if current.get(k) != v})
    return out


def plan_node(
    ref: Ref,
    observed: Observed,
    *,
    labels: dict[str, str],
    capacity: dict[str, str],
    owns_label: Callable[[str], bool],
    owns_capacity: Callable[[str], bool],
    also: Mapping[str, str | None] | None = None,
) -> list[Action]:
    """Patches of a Node's owned labels and capacity keys, only where they differ.

    ``also``: another owner's label patch (the scheduling chain's, keys disjoint from ours,
    already only what differs) sent in the same request, so a Node both owners label at the
    same moment is one write, not two.
    """
    actions: list[Action] = []
    current_labels = observed.body.get("metadata", {}).get("labels") or {}
    label_patch = _owned_diff(current_labels, labels, owns_label)
    label_patch.update(also or {})
    if label_patch:
        body = {"metadata": {"labels": label_patch}}
        actions.append(Patch(ref=ref, body=body, precondition=False))
    current_cap = observed.body.get("status", {}).get("capacity") or {}
    cap_patch = _owned_diff(current_cap, capacity, owns_capacity)
    if cap_patch:
        body = {"status": {"capacity": cap_patch}}
        actions.append(Patch(ref=ref, body=body, subresource="status", precondition=False))
    return actions

"""``plan(desired, observed) -> actions``: the decisions of every reconciler, pure and synchronous.

An object the control plane owns (``Devices``, ``NodeModelStore``, the ledger records of the KV
sink) is described by :class:`Desired`: the metadata it owns, its ``spec`` and its ``status``.
Planning compares that with what the sink last returned and emits the fewest writes:

- nothing when every owned field already matches (write only on change);
- a create (without status: the status subresource ignores it), then a status patch;
- a merge patch of ``spec``/owned metadata, and a separate merge patch of ``status``;
- a delete when the object should not exist.

Patches are RFC 7386 merge patches computed by :func:`diff` (``None`` removes a key). The
executor adds the ``resourceVersion`` precondition; a Node is patched without one because the
kubelet updates it all the time and only owned keys are touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from controlplane.resources import Observed, Ref

__all__ = [
    "Action",
    "Create",
    "Delete",
    "Desired",
    "Patch",
    "diff",
    "plan",
    "plan_node",
    "settle_conditions",
]


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


def diff(old: Any, new: Any) -> Any:
    """The merge patch turning ``old`` into ``new`` (only for dicts; ``{}`` when equal)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif old[k] != v:
            out[k] = diff(old[k], v) if isinstance(v, dict) and isinstance(old[k], dict) else v
    return out


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
            "metadata": {"name": ref.name, **desired.metadata},
        }
        if ref.namespace:
            body["metadata"]["namespace"] = ref.namespace
        if desired.spec is not None:
            body["spec"] = desired.spec
        if status_on_create and desired.status is not None:
            body["status"] = desired.status
            return [Create(ref=ref, body=body)]
        actions: list[Action] = [Create(ref=ref, body=body)]
        if desired.status is not None:
            actions.append(Patch(ref=ref, body={"status": desired.status}, subresource="status"))
        return actions
    return _plan_update(ref, desired, observed.body)


def _plan_update(ref: Ref, desired: Desired, current: dict[str, Any]) -> list[Action]:
    actions: list[Action] = []
    main: dict[str, Any] = {}
    meta = current.get("metadata", {})
    owned_meta = {k: v for k, v in desired.metadata.items() if meta.get(k) != v}
    if owned_meta:
        main["metadata"] = owned_meta
    if desired.spec is not None and current.get("spec") != desired.spec:
        main["spec"] = diff(current.get("spec") or {}, desired.spec)
    if main:
        actions.append(Patch(ref=ref, body=main))
    if desired.status is not None and current.get("status") != desired.status:
        status = diff(current.get("status") or {}, desired.status)
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
) -> list[Action]:
    """Patches of a Node's owned labels and capacity keys, only where they differ."""
    actions: list[Action] = []
    current_labels = observed.body.get("metadata", {}).get("labels") or {}
    label_patch = _owned_diff(current_labels, labels, owns_label)
    if label_patch:
        body = {"metadata": {"labels": label_patch}}
        actions.append(Patch(ref=ref, body=body, precondition=False))
    current_cap = observed.body.get("status", {}).get("capacity") or {}
    cap_patch = _owned_diff(current_cap, capacity, owns_capacity)
    if cap_patch:
        body = {"status": {"capacity": cap_patch}}
        actions.append(Patch(ref=ref, body=body, subresource="status", precondition=False))
    return actions

"""ModelStoreBinding decisions, pure and synchronous: usage, phase, conditions, agent quotas.

A binding lets its namespace's models use the caches of the nodes its ModelStores won, within
``spec.quota.bytes``. Usage is counted from the nodes' ``models`` events (the ledger), never
from the API: each distinct manifest digest of the namespace's resolved ModelArtifacts, times
every node of the bound stores that holds it ready or is downloading it (a download counts its
whole size: the bytes are reserved on that node), at the size the artifact resolved to.

Phase:

=========  ==========================================================================
Ready      every store exists and the usage is within the quota (or there is none)
OverQuota  the usage is above the quota: mounts that would start a download are refused
Error      a ``storeRefs`` entry names no ModelStore, or ``quota.bytes`` is no quantity
=========  ==========================================================================

The condition ``OverQuota`` says the same in Kubernetes terms. What the node agents need to
enforce the quota at mount time is :func:`quotas`, carried in each of the namespace's
``ArtifactRecord`` (``bus.records.BindingQuota``): the agents hold no Kubernetes rights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from bus import events, records
from controlplane.stores import storespec
from kit.tables import human_bytes
from kit.values import InvalidValue, parse_quantity

__all__ = [
    "HELD",
    "Usage",
    "binding_status",
    "namespace_digests",
    "node_stores",
    "quota_bytes",
    "quotas",
    "settle",
    "used_bytes",
]

HELD: Final = frozenset({"pending", "downloading", "ready", "evicting"})
"""Model states that take room on a node (a failed model holds nothing counted)."""

Usage = Mapping[str, int]
"""Binding name -> used bytes."""


def quota_bytes(binding: Mapping[str, Any]) -> int | None:
    """``spec.quota.bytes`` in whole bytes (rounded up); None when absent.

    :raises InvalidValue: it is no quantity, or negative.
    """
    raw = ((binding.get("spec") or {}).get("quota") or {}).get("bytes")
    if raw is None:
        return None
    if not isinstance(raw, (int, str)) or isinstance(raw, bool):
        raise InvalidValue(f"quota.bytes {raw!r} is not a quantity")
    value = parse_quantity(raw)
    if value < 0:
        raise InvalidValue(f"quota.bytes {raw!r} is negative")
    return math.ceil(value)


def store_refs(binding: Mapping[str, Any]) -> tuple[str, ...]:
    refs = (binding.get("spec") or {}).get("storeRefs") or []
    return tuple(str(r.get("name") or "") for r in refs if isinstance(r, dict))


def node_stores(
    stores: Sequence[Mapping[str, Any]], labels: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """Node -> the ModelStore that won it (nodes no store selects are left out)."""
    out = {}
    for node, node_labels in labels.items():
        won = storespec.winner(stores, node_labels)
        if won is not None:
            out[node] = str(won["metadata"]["name"])
    return out


def namespace_digests(artifacts: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Namespace -> digest -> size, over every resolved ModelArtifact."""
    out: dict[str, dict[str, int]] = {}
    for a in artifacts:
        pinned = (a.get("status") or {}).get("resolved") or {}
        digest = pinned.get("manifestDigest")
        if not digest:
            continue
        ns = (a.get("metadata") or {}).get("namespace") or ""
        out.setdefault(ns, {})[digest] = int(pinned.get("sizeBytes") or 0)
    return out


def used_bytes(
    stores: Iterable[str],
    digests: Mapping[str, int],
    node_store: Mapping[str, str],
    models: Mapping[str, tuple[events.ModelState, ...] | None],
) -> int:
    """Bytes of ``digests`` held on the nodes of ``stores``: each digest once per node."""
    wanted = set(stores)
    total = 0
    for node, node_models in models.items():
        if node_store.get(node) not in wanted:
            continue
        held = {m.digest or m.model for m in node_models or () if m.state in HELD}
        total += sum(size for digest, size in digests.items() if digest in held)
    return total


def binding_status(
    binding: Mapping[str, Any], existing: Iterable[str], used: int, now: str
) -> dict[str, Any]:
    """The whole desired ``status`` of one binding."""
    out: dict[str, Any] = {}
    generation = (binding.get("metadata") or {}).get("generation")
    if isinstance(generation, int):
        out["observedGeneration"] = generation
    missing = sorted(set(store_refs(binding)) - set(existing))
    try:
        quota = quota_bytes(binding)
    except InvalidValue as e:
        phase, message, over = "Error", str(e), None
    else:
        if missing:
            phase, message = "Error", f"no ModelStore named {', '.join(missing)}"
        elif quota is not None and used > quota:
            phase = "OverQuota"
            message = f"{human_bytes(used)} used of a {human_bytes(quota)} quota"
        else:
            phase, message = "Ready", ""
        over = quota is not None and used > quota
    out.update(phase=phase, phaseMessage=message, usedBytes=used, used=human_bytes(used))
    condition = {
        "type": "OverQuota",
        "status": "Unknown" if over is None else ("True" if over else "False"),
        "reason": "QuotaInvalid" if over is None else ("OverQuota" if over else "WithinQuota"),
        "message": message if over is not False else "",
    }
    previous = (binding.get("status") or {}).get("conditions") or []
    out["conditions"] = settle([condition], previous, now)
    return out


def settle(
    conditions: list[dict[str, Any]], previous: Iterable[Mapping[str, Any]], now: str
) -> list[dict[str, Any]]:
    """``conditions`` with ``lastTransitionTime`` kept from ``previous`` where the status did
    not change (``now`` where it did): an unchanged object plans no write."""
    before = {c.get("type"): c for c in previous if isinstance(c, Mapping)}
    out = []
    for c in conditions:
        old = before.get(c["type"])
        same = old is not None and old.get("status") == c["status"]
        out.append(
            {**c, "lastTransitionTime": old.get("lastTransitionTime", now) if same and old else now}
        )
    return out


def quotas(
    bindings: Iterable[Mapping[str, Any]], usage: Usage
) -> dict[str, tuple[records.BindingQuota, ...]]:
    """Namespace -> what its artifact records carry for the agents (sorted by binding name).

    A binding whose quota cannot be read gets ``quota_bytes`` 0 there: a quota someone meant
    to set but got wrong refuses new downloads rather than allowing any.
    """
    out: dict[str, list[records.BindingQuota]] = {}
    for b in sorted(bindings, key=lambda b: b["metadata"]["name"]):
        meta = b["metadata"]
        try:
            limit = quota_bytes(b)
        except InvalidValue:
            limit = 0
        out.setdefault(meta.get("namespace") or "", []).append(
            records.BindingQuota(
                name=meta["name"],
                stores=store_refs(b),
                quota_bytes=limit,
                used_bytes=usage.get(f"{meta.get('namespace') or ''}/{meta['name']}", 0),
            )
        )
    return {ns: tuple(q) for ns, q in out.items()}

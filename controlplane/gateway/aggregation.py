"""What the gateway's read routes answer, from the objects each cluster holds (pure).

Three shapes, all ``{"items": [...]}`` as a GPUStack server reads them:

- **cluster-tagged** (:func:`tagged`): every cluster's objects as they are, each with
  ``"cluster": "<id>"`` added;
- **aggregated flavors** (:func:`aggregate_flavors`): flavors whose whole ``spec`` is equal fold
  into one ``{name, spec: {...spec, clusters: [sorted]}}``, accelerated ones first, then by name;
- **aggregated InstanceTypes** (:func:`aggregate_instance_types`): types equal but for
  ``inactive``, ``displayName`` and ``description`` fold into one object named after the shape
  (:func:`aggregated_name`), whose status says the largest single request and the remaining
  amount per dimension, and groups the candidates (cluster, type) into tiers by the largest
  request each can grant, largest first.

Only **Active** candidates count: an InstanceType of ours has no phase, so a type whose
``spec.inactive`` is true is Inactive (its ClusterQueue admits nothing) and every other is Active.
Amounts are decimal strings, the form GPUStack's schema reads (``"8"``); the dimensions are the
InstanceType status' families: ``accelerator`` (cards), ``acceleratorShared`` (shares),
``acceleratorSliced`` (memory percent). Partitions (``acceleratorPartitioned``, MIG instances) have
no honest total, so an overview lists them per profile instead: ``remaining`` sums the remaining
profiles by name, ``onceMaxRequest`` is the best candidate's profiles capped at one; a candidate
carries its own view and ledger. Everything is sorted, so equal inputs give equal output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

__all__ = [
    "DIMENSIONS",
    "aggregate_flavors",
    "aggregate_instance_types",
    "aggregated_name",
    "changes",
    "tagged",
]

DIMENSIONS: Final = ("accelerator", "acceleratorShared", "acceleratorSliced")
PARTITIONED: Final = "acceleratorPartitioned"
_PROFILE_LISTS: Final = ("allocatedProfiles", "remainingProfiles")
_NOT_SHAPE: Final = ("inactive", "displayName", "description")

Held = Mapping[str, Iterable[Mapping[str, Any]]]
"""Objects by cluster id."""


def tagged(held: Held) -> dict[str, Any]:
    """Every object with its cluster, clusters in order, objects in the order held."""
    return {"items": [{**obj, "cluster": c} for c in sorted(held) for obj in held[c]]}


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    return dict(spec) if isinstance(spec, Mapping) else {}


def _key(value: Mapping[str, Any]) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def aggregate_flavors(held: Held) -> dict[str, Any]:
    """Flavors with an equal spec across clusters as one; named by the least name among them."""
    groups: dict[bytes, tuple[dict[str, Any], set[str], set[str]]] = {}
    for cluster in sorted(held):
        for obj in held[cluster]:
            spec = _spec(obj)
            _, names, clusters = groups.setdefault(_key(spec), (spec, set(), set()))
            names.add(_name(obj))
            clusters.add(cluster)
    items: list[dict[str, Any]] = [
        {"name": min(names), "spec": {**spec, "clusters": sorted(clusters)}}
        for spec, names, clusters in groups.values()
    ]
    items.sort(key=lambda i: (not _accelerated(i["spec"]), str(i["name"])))
    return {"items": items}


def _accelerated(spec: Mapping[str, Any]) -> bool:
    return bool(spec.get("acceleratable") or spec.get("acceleratorGroup"))


def aggregated_name(spec: Mapping[str, Any]) -> str:
    """``<generalGroup>-<acceleratorGroup>-<os>-<arch>``, without the accelerator for CPU types.

    The reference also names CPU, RAM and local storage sizes; our InstanceTypes carry none
    (one type spans every node of its accelerator group), so the name stops at the platform.
    """
    parts = [spec.get("generalGroup") or "generic"]
    if spec.get("acceleratorGroup"):
        parts.append(str(spec["acceleratorGroup"]))
    parts += [str(spec.get("os") or "unknown"), str(spec.get("arch") or "unknown")]
    return "-".join(str(p) for p in parts)


def _view(obj: Mapping[str, Any], dimension: str) -> tuple[int, int, int]:
    view = (obj.get("status") or {}).get(dimension) or {}
    return tuple(_count(view.get(k)) for k in ("onceMaxRequest", "remaining", "capacity"))  # type: ignore[return-value]


def _count(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def _candidate(cluster: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"cluster": cluster, "name": _name(obj), "phase": _phase(obj)}
    for d in DIMENSIONS:
        once, remaining, capacity = _view(obj, d)
        out[d] = {"onceMaxRequest": str(once), "remaining": str(remaining),
                  "capacity": str(capacity)}  # fmt: skip
    partitioned = (obj.get("status") or {}).get(PARTITIONED)
    if isinstance(partitioned, Mapping):
        once, remaining, capacity = _view(obj, PARTITIONED)
        profiles = {k: _profiles(partitioned.get(k)) for k in _PROFILE_LISTS}
        out[PARTITIONED] = {
            "onceMaxRequest": str(once), "remaining": str(remaining), "capacity": str(capacity),
            "allocatedProfiles": [p for p in profiles["allocatedProfiles"] if p["count"] > 0],
            "remainingProfiles": profiles["remainingProfiles"],
        }  # fmt: skip
    return out


def _profiles(value: Any) -> list[dict[str, Any]]:
    """A profile ledger as ``[{name, count}]`` by name (unreadable entries dropped)."""
    counts: dict[str, int] = {}
    for entry in value if isinstance(value, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            counts[entry["name"]] = counts.get(entry["name"], 0) + _count(entry.get("count"))
    return [{"name": n, "count": counts[n]} for n in sorted(counts)]


def _partitioned(candidates: list[dict[str, Any]], key: str) -> list[dict[str, Any]] | None:
    """Partition profiles in an overview: ``remaining`` sums every candidate's remaining
    profiles by name; ``onceMaxRequest`` is the profiles of the candidate with the largest
    partitioned request, each capped at one (a request is one instance). None: no ledger."""
    ledgers = [c for c in candidates if PARTITIONED in c]
    if not ledgers:
        return None
    if key == "remaining":
        return _profiles([p for c in ledgers for p in c[PARTITIONED]["remainingProfiles"]])
    best = max(ledgers, key=lambda c: int(c[PARTITIONED]["onceMaxRequest"]))
    return [{"name": p["name"], "count": min(1, p["count"])}
            for p in best[PARTITIONED]["remainingProfiles"]]  # fmt: skip


def _phase(obj: Mapping[str, Any]) -> str:
    return "Inactive" if _spec(obj).get("inactive") else "Active"


def _overview(candidates: list[dict[str, Any]], key: str, fold: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        d: str(fold((int(c[d][key]) for c in candidates), 0)) for d in DIMENSIONS
    }
    profiles = _partitioned(candidates, key)
    if profiles is not None:
        out[PARTITIONED] = profiles
    return out


def _most(values: Iterable[int], default: int) -> int:
    return max(values, default=default)


def _sum(values: Iterable[int], start: int) -> int:
    return sum(values, start)


def _tiers(candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    levels: dict[int, list[dict[str, Any]]] = {}
    for c in candidates:
        levels.setdefault(int(c["accelerator"]["onceMaxRequest"]), []).append(c)
    return [
        {
            "onceMaxRequest": _overview(levels[level], "onceMaxRequest", _most),
            "remaining": _overview(levels[level], "remaining", _sum),
            "candidates": levels[level],
        }
        for level in sorted(levels, reverse=True)
    ]


def aggregate_instance_types(held: Held) -> dict[str, Any]:
    """InstanceTypes of one shape across clusters as one object; only Active ones count."""
    groups: dict[bytes, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for cluster in sorted(held):
        for obj in sorted(held[cluster], key=_name):
            full = _spec(obj)
            shape = {k: v for k, v in full.items() if k not in _NOT_SHAPE}
            _, candidates = groups.setdefault(_key(shape), (shape, []))
            candidates.append(_candidate(cluster, obj))
    items = []
    taken: set[str] = set()
    for key in sorted(groups, key=lambda k: (aggregated_name(groups[k][0]), k)):
        shape, candidates = groups[key]
        name = aggregated_name(shape)
        if name in taken:  # two shapes, one platform name: the later one says how it differs
            name = f"{name}-{_digest(key)}"
        taken.add(name)
        active = [c for c in candidates if c["phase"] == "Active"]
        spec = {**shape, "acceleratable": _accelerated(shape)}
        status = {
            "onceMaxRequest": _overview(active, "onceMaxRequest", _most),
            "remaining": _overview(active, "remaining", _sum),
            "tiers": _tiers(active),
        }
        items.append({"name": name, "spec": spec, "status": status})
    return {"items": items}


def _digest(key: bytes) -> str:
    h = 0xCBF29CE484222325
    for byte in key:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"[:8]


def changes(
    old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, Mapping[str, Any]]]:
    """Watch events (type, object) that turn the aggregate ``old`` into ``new``, by name."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            out.append(("DELETED", old[name]))
        elif name not in old:
            out.append(("ADDED", new[name]))
        elif old[name] != new[name]:
            out.append(("MODIFIED", new[name]))
    return out

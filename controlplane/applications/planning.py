"""The pure plan: desired objects of every enabled application against the inventory of what
was applied before → what to apply, what to prune, and the inventory to record.

The inventory (kept in the ConfigMap ``gpustack-applications`` by :mod:`.installing`) lists, per
application, the version applied and every object's identity. Invariants:

- an application that is disabled has all its recorded objects pruned and leaves the inventory;
- an upgraded application (a new pin) has the objects its new manifest no longer holds pruned;
- an application whose manifest could not be had or verified (``failed``) keeps its inventory
  entry and its objects: a broken mirror never uninstalls anything;
- an application whose apply failed part-way records what it had and what it was applying
  (:func:`settle`), so whatever reached the cluster can still be pruned later;
- applies are ordered Namespaces, then CRDs, then the rest; prunes in the reverse order, so a
  namespace or CRD goes last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

__all__ = ["Entry", "Identity", "Plan", "identity", "plan", "settle"]

Identity = tuple[str, str, str, str]
"""(apiVersion, kind, namespace or "", name)."""

_FIRST = {"Namespace": 0, "CustomResourceDefinition": 1}


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    objects: tuple[Identity, ...]


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    apply: tuple[tuple[str, dict[str, Any]], ...]
    """(application, object) in apply order."""
    prune: tuple[tuple[str, Identity], ...]
    """(application, object identity) in delete order."""
    inventory: dict[str, Entry]


def identity(obj: Mapping[str, Any]) -> Identity:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"])


def _rank(kind: str) -> int:
    return _FIRST.get(kind, 2)


def plan(
    desired: Mapping[str, tuple[str, list[dict[str, Any]]]],
    inventory: Mapping[str, Entry],
    *,
    failed: Iterable[str] = (),
) -> Plan:
    """``desired``: application → (version, configured objects) for every enabled application
    whose manifest was verified; ``failed``: enabled ones whose manifest was not."""
    keep = set(failed)
    applies = sorted(
        ((app, obj) for app, (_, objs) in desired.items() for obj in objs),
        key=lambda pair: (_rank(pair[1]["kind"]), pair[0]),
    )
    prunes: list[tuple[str, Identity]] = []
    new: dict[str, Entry] = {app: inventory[app] for app in keep if app in inventory}
    for app, entry in inventory.items():
        if app in keep:
            continue
        wanted = {identity(o) for o in desired[app][1]} if app in desired else set()
        prunes.extend((app, ident) for ident in entry.objects if ident not in wanted)
    for app, (version, objs) in desired.items():
        new[app] = Entry(version=version, objects=tuple(identity(o) for o in objs))
    prunes.sort(key=lambda pair: (-_rank(pair[1][1]), pair[0]))
    return Plan(apply=tuple(applies), prune=tuple(prunes), inventory=new)


def settle(
    planned: Mapping[str, Entry], before: Mapping[str, Entry], broken: Iterable[str]
) -> dict[str, Entry]:
    """The inventory to record after applying ``planned``: a ``broken`` application keeps its
    earlier version and lists its earlier objects and the new ones (any may exist now)."""
    out = dict(planned)
    for app in broken:
        old, new = before.get(app), planned.get(app)
        objects = (old.objects if old else ()) + (new.objects if new else ())
        version = old.version if old else (new.version if new else "")
        out[app] = Entry(version=version, objects=tuple(dict.fromkeys(objects)))
    return out

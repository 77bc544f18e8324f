"""Fleet-wide ``AggregatedInstanceType`` objects from the membership book (pure).

One object per InstanceType name (members name a type identically for the same accelerator
group, os and arch). For each family — exclusive cards (``accelerator``), shares
(``acceleratorShared``), memory percent of sliced cards (``acceleratorSliced``) and partition
instances (``acceleratorPartitioned``) — the status holds:

- the **overview**: the largest single request any Active member can grant, and ``remaining``
  and ``capacity`` summed over Active members (partitions also per profile);
- the **tiers**: Active members grouped by their ``onceMaxRequest`` (largest first), each level
  with its clusters and summed ``remaining``/``capacity`` — "3 clusters can take an 8-card job,
  5 more a 4-card one".

Members that are not Active, and types a member marked inactive, are listed but never counted.
The output is deterministic (sorted everywhere), so equal books give byte-equal objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from bus.fleet import InstanceTypeSummary, PartitionedView, View
from controlplane.gateway.membership import ACTIVE, MemberState
from controlplane.resources import GROUP, VERSION

__all__ = ["FAMILIES", "KIND", "LIST_KIND", "aggregate", "as_list"]

KIND: Final = "AggregatedInstanceType"
LIST_KIND: Final = "AggregatedInstanceTypeList"
API_VERSION: Final = f"{GROUP}/{VERSION}"
FAMILIES: Final = (
    "accelerator",
    "acceleratorShared",
    "acceleratorSliced",
    "acceleratorPartitioned",
)

Contribution = tuple[str, InstanceTypeSummary]
"""(cluster, that cluster's summary of the type)."""


def _view_of(summary: InstanceTypeSummary, family: str) -> View:
    views = summary.views
    return {
        "accelerator": views.accelerator,
        "acceleratorShared": views.accelerator_shared,
        "acceleratorSliced": views.accelerator_sliced,
        "acceleratorPartitioned": views.accelerator_partitioned,
    }[family]


def _overview(family: str, counted: list[Contribution]) -> dict[str, Any]:
    views = [_view_of(s, family) for _, s in counted]
    out: dict[str, Any] = {
        "onceMaxRequest": max((v.once_max_request for v in views), default=0),
        "remaining": sum(v.remaining for v in views),
        "capacity": sum(v.capacity for v in views),
    }
    if family == "acceleratorPartitioned":
        parts = [v for v in views if isinstance(v, PartitionedView)]
        out["allocatedProfiles"] = _summed(p for v in parts for p in v.allocated_profiles)
        out["remainingProfiles"] = _summed(p for v in parts for p in v.remaining_profiles)
    return out


def _summed(counts: Iterable[Any]) -> list[dict[str, Any]]:
    total: dict[str, int] = {}
    for c in counts:
        total[c.name] = total.get(c.name, 0) + c.count
    return [{"name": n, "count": total[n]} for n in sorted(total)]


def _tiers(family: str, counted: list[Contribution]) -> list[dict[str, Any]]:
    levels: dict[int, list[tuple[str, View]]] = {}
    for cluster, summary in counted:
        view = _view_of(summary, family)
        levels.setdefault(view.once_max_request, []).append((cluster, view))
    return [
        {
            "onceMaxRequest": level,
            "clusters": sorted(c for c, _ in levels[level]),
            "remaining": sum(v.remaining for _, v in levels[level]),
            "capacity": sum(v.capacity for _, v in levels[level]),
        }
        for level in sorted(levels, reverse=True)
    ]


def _object(name: str, listed: list[tuple[MemberState, InstanceTypeSummary]]) -> dict[str, Any]:
    counted = [
        (m.cluster, s) for m, s in listed if m.state == ACTIVE and not s.inactive
    ]  # fmt: skip
    status: dict[str, Any] = {
        "members": [
            {"cluster": m.cluster, "state": m.state, **({"inactive": True} if s.inactive else {})}
            for m, s in listed
        ],
        "activeMembers": len(counted),
    }
    for family in FAMILIES:
        status[family] = _overview(family, counted)
    status["tiers"] = {family: _tiers(family, counted) for family in FAMILIES}
    status["summary"] = " ".join(
        f"{status[f]['onceMaxRequest']}/{status[f]['remaining']}" for f in FAMILIES
    )
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "status": status}


def aggregate(book: Mapping[str, MemberState]) -> dict[str, dict[str, Any]]:
    """Every AggregatedInstanceType by name; a type a member lists twice counts once (the last)."""
    by_name: dict[str, dict[str, tuple[MemberState, InstanceTypeSummary]]] = {}
    for cluster in sorted(book):
        member = book[cluster]
        for summary in member.summary.instance_types:
            by_name.setdefault(summary.name, {})[cluster] = (member, summary)
    return {
        name: _object(name, [by_name[name][c] for c in sorted(by_name[name])])
        for name in sorted(by_name)
    }


def as_list(objects: Mapping[str, dict[str, Any]], resource_version: int) -> dict[str, Any]:
    """The Kubernetes-style list a client gets from ``GET …/aggregatedinstancetypes``."""
    return {
        "apiVersion": API_VERSION,
        "kind": LIST_KIND,
        "metadata": {"resourceVersion": str(resource_version)},
        "items": [objects[n] for n in sorted(objects)],
    }

"""Discovery documents for any number of group versions: pure.

- v1: ``APIGroupList`` (``/apis``), ``APIGroup`` (``/apis/<group>``), ``APIResourceList``
  (``/apis/<group>/<version>``, subresources as ``<plural>/<sub>``);
- v2 aggregated discovery: an ``APIGroupDiscoveryList`` (``apidiscovery.k8s.io/v2``) for
  ``/apis`` when the ``Accept`` header asks for it (kube-apiserver's aggregator does, and
  falls back to the per-version documents otherwise). :func:`wants_v2` reads the header.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from controlplane.extension.core.model import GroupVersion, ResourceSpec

__all__ = ["V2_TYPE", "api_group", "api_group_list", "api_resource_list", "v2_list", "wants_v2"]

V2_TYPE: Final = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def wants_v2(accept: str) -> bool:
    """Whether any alternative of the ``Accept`` header is the v2 aggregated discovery JSON."""
    for alternative in accept.split(","):
        params = {p.strip() for p in alternative.split(";")}
        if {"g=apidiscovery.k8s.io", "v=v2", "as=APIGroupDiscoveryList"} <= params and (
            "application/json" in params
        ):
            return True
    return False


def _version(gv: GroupVersion) -> dict[str, str]:
    return {"groupVersion": gv.group_version, "version": gv.version}


def api_group(gv: GroupVersion) -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", "name": gv.group, "versions": [_version(gv)],
            "preferredVersion": _version(gv)}  # fmt: skip


def api_group_list(gvs: Sequence[GroupVersion]) -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [{k: v for k, v in api_group(gv).items() if k not in ("kind", "apiVersion")}
                       for gv in gvs]}  # fmt: skip


def _v1_resource(r: ResourceSpec) -> dict[str, Any]:
    return {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": list(r.verbs), "shortNames": list(r.short),
            "categories": list(r.categories)}  # fmt: skip


def api_resource_list(gv: GroupVersion) -> dict[str, Any]:
    resources = []
    for r in gv.resources:
        resources.append(_v1_resource(r))
        resources += [{"name": f"{r.plural}/{s.name}", "singularName": "", "kind": s.kind,
                       "namespaced": r.namespaced, "verbs": list(s.verbs)}
                      for s in r.subresources]  # fmt: skip
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv.group_version,
            "resources": resources}  # fmt: skip


def _v2_resource(gv: GroupVersion, r: ResourceSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "resource": r.plural, "singularResource": r.singular,
        "scope": "Namespaced" if r.namespaced else "Cluster",
        "responseKind": {"group": gv.group, "version": gv.version, "kind": r.kind},
        "verbs": list(r.verbs),
    }  # fmt: skip
    if r.short:
        out["shortNames"] = list(r.short)
    if r.categories:
        out["categories"] = list(r.categories)
    if r.subresources:
        out["subresources"] = [
            {"subresource": s.name, "verbs": list(s.verbs),
             "responseKind": {"group": gv.group, "version": gv.version, "kind": s.kind}}
            for s in r.subresources
        ]  # fmt: skip
    return out


def v2_list(gvs: Sequence[GroupVersion]) -> dict[str, Any]:
    items = [
        {"metadata": {"name": gv.group, "creationTimestamp": None},
         "versions": [{"version": gv.version, "freshness": "Current",
                       "resources": [_v2_resource(gv, r) for r in gv.resources]}]}
        for gv in gvs
    ]  # fmt: skip
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {}, "items": items}  # fmt: skip

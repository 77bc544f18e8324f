"""What ``worker.gpustack.ai/v1`` serves: its resources, their discovery and printed columns.

Pure data and pure functions. Each resource is the v1 view of a stored ``v1alpha1`` object: the
same body with ``apiVersion: worker.gpustack.ai/v1`` (:func:`view`), so a client reads one shape
whichever version it asks for. Verbs follow the reference: reads everywhere; ``delete`` of
``nodemodelstores`` (and of ``devices``, so that the garbage collector, which reaches a group
through its preferred version and only tracks what it may delete, still removes them with their
Node); ``modelartifacts/progress`` is computed per request.

Columns are computed here in Python (the Table a ``kubectl get`` asks for), not by JSONPath: the
``ACCELERATOR(EX/SH/SL/PT)`` cell joins four pairs of numbers, which no JSONPath can.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

__all__ = [
    "GROUP",
    "GROUP_VERSION",
    "RESOURCES",
    "VERSION",
    "Column",
    "ResourceInfo",
    "api_group",
    "api_resource_list",
    "table",
    "view",
]

GROUP: Final = "worker.gpustack.ai"
VERSION: Final = "v1"
GROUP_VERSION: Final = f"{GROUP}/{VERSION}"
STORED_VERSION: Final = "v1alpha1"

Cell = Callable[[Mapping[str, Any]], Any]


class Column(msgspec.Struct, frozen=True):
    name: str
    type: str
    cell: Cell
    description: str
    priority: int = 0
    """1: shown with ``-o wide`` only."""
    format: str = ""


class ResourceInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    singular: str
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    short: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()


def _get(body: Mapping[str, Any], *path: str | int) -> Any:
    """The value at ``path`` (None where any step is missing or of another type)."""
    value: Any = body
    for step in path:
        if isinstance(step, int):
            value = value[step] if isinstance(value, list) and len(value) > step else None
        else:
            value = value.get(step) if isinstance(value, Mapping) else None
        if value is None:
            return None
    return value


def _condition(kind: str) -> Cell:
    def cell(body: Mapping[str, Any]) -> Any:
        for c in _get(body, "status", "conditions") or ():
            if isinstance(c, Mapping) and c.get("type") == kind:
                return c.get("status")
        return None

    return cell


def _at(*path: str | int) -> Cell:
    return lambda body: _get(body, *path)


def _percent(body: Mapping[str, Any]) -> Any:
    used = _get(body, "status", "capacity", "usedPercent")
    return None if used is None else f"{used}%"


_VIEWS: Final = ("accelerator", "acceleratorShared", "acceleratorSliced", "acceleratorPartitioned")


def _pairs(field: str, second: str) -> Cell:
    """``a/b`` of the four views (exclusive, shared, sliced, partitioned), 0/0 where absent."""

    def cell(body: Mapping[str, Any]) -> Any:
        status = _get(body, "status")
        if not isinstance(status, Mapping) or "accelerator" not in status:
            return None  # a CPU InstanceType carries no accelerator views
        out = []
        for v in _VIEWS:
            found = status.get(v)
            view_: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
            out.append(f"{view_.get(field, 0)}/{view_.get(second, 0)}")
        return " ".join(out)

    return cell


def _unhealthy_ids(body: Mapping[str, Any]) -> Any:
    ids = [
        a.get("id")
        for g in _get(body, "spec", "groups") or ()
        for a in (g.get("accelerators") or () if isinstance(g, Mapping) else ())
        if isinstance(a, Mapping) and (a.get("status") or {}).get("unhealthy")
    ]
    return ",".join(str(i) for i in ids) or None


_AGE: Final = Column("Age", "date", _at("metadata", "creationTimestamp"), "time since creation")
_WIDE_AGE: Final = msgspec.structs.replace(_AGE, priority=1)

RESOURCES: Final[Mapping[str, ResourceInfo]] = {
    r.name: r
    for r in (
        ResourceInfo(
            name="devices", singular="devices", kind="Devices", namespaced=False,
            verbs=("get", "list", "watch", "delete"), short=("devs",),
            columns=(
                Column("Product", "string", _at("spec", "groups", 0, "name"), "the first group"),
                Column("Accelerators", "integer", _at("status", "summary", "accelerators"),
                       "accelerators on the node"),
                Column("Memory", "string", _at("status", "summary", "memory"), "VRAM in all"),
                Column("Unhealthy", "integer", _at("status", "summary", "unhealthy"),
                       "unhealthy accelerators"),
                Column("Allocated", "integer", _at("status", "summary", "allocated"),
                       "accelerators with an allocation"),
                Column("Driver", "string", _at("spec", "groups", 0, "driverVersion"),
                       "the first group's driver", priority=1),
                Column("UnhealthyIDs", "string", _unhealthy_ids, "ids of unhealthy accelerators",
                       priority=1),
                _AGE,
            ),
        ),
        ResourceInfo(
            name="nodemodelstores", singular="nodemodelstore", kind="NodeModelStore",
            namespaced=False, verbs=("get", "list", "watch", "delete"), short=("nms",),
            columns=(
                Column("Ready", "string", _condition("Ready"), "the cache serves"),
                Column("Used", "string", _percent, "share of the cache's capacity used"),
                Column("Models", "integer", _at("status", "modelCounts", "ready"),
                       "models ready on the node"),
                Column("Downloading", "integer", _at("status", "modelCounts", "downloading"),
                       "models downloading"),
                _WIDE_AGE,
            ),
        ),
        ResourceInfo(
            name="modelartifacts", singular="modelartifact", kind="ModelArtifact",
            namespaced=True, verbs=("get", "list", "watch"), short=("mart",),
            subresources=("progress",),
            columns=(
                Column("Repository", "string", _at("spec", "source", "huggingFace", "repository"),
                       "the Hugging Face repository"),
                Column("Resolved", "string", _condition("Resolved"), "revision and digest known"),
                Column("Ready", "integer", _at("status", "nodes", "ready"), "nodes holding it"),
                Column("Downloading", "integer", _at("status", "nodes", "downloading"),
                       "nodes downloading it"),
                Column("Digest", "string", _at("status", "resolved", "manifestDigest"),
                       "the manifest digest", priority=1),
                _AGE,
            ),
        ),
        ResourceInfo(
            name="instancetypes", singular="instancetype", kind="InstanceType",
            namespaced=False, verbs=("get", "list", "watch"), short=("instype",),
            columns=(
                Column("ACCELERATOR(EX/SH/SL/PT)", "string",
                       _pairs("onceMaxRequest", "remaining"),
                       "onceMaxRequest/remaining: exclusive, shared, sliced, partitioned"),
                Column("ENTRANCE", "string", _at("status", "entrance"), "the LocalQueue to name"),
                Column("CAPACITY(EX/SH/SL/PT)", "string", _pairs("remaining", "capacity"),
                       "remaining/capacity of the four views", priority=1),
                Column("PRODUCT", "string", _at("spec", "product"), "the accelerator product",
                       priority=1),
                Column("INACTIVE", "boolean", _at("spec", "inactive"), "its queue holds",
                       priority=1),
                _AGE,
            ),
        ),
        ResourceInfo(
            name="instancetypeflavors", singular="instancetypeflavor", kind="InstanceTypeFlavor",
            namespaced=False, verbs=("get", "list", "watch"), short=("instypeflavor",),
            columns=(
                Column("Accelerator", "string", _at("spec", "acceleratorGroup"),
                       "the accelerator group"),
                Column("Count", "integer", _at("spec", "count"), "cards per node"),
                Column("Nodes", "integer", _at("spec", "nodes"), "nodes of this flavor"),
                _AGE,
            ),
        ),
    )
}  # fmt: skip


def view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The v1 view of a stored object: the same body under this group version."""
    return {**body, "apiVersion": GROUP_VERSION}


def api_group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version],
            "preferredVersion": version}  # fmt: skip


def api_resource_list() -> dict[str, Any]:
    """``GET /apis/worker.gpustack.ai/v1``: what kubectl and the garbage collector discover."""
    resources: list[dict[str, Any]] = []
    for r in RESOURCES.values():
        resources.append(
            {"name": r.name, "singularName": r.singular, "namespaced": r.namespaced,
             "kind": r.kind, "verbs": list(r.verbs), "shortNames": list(r.short),
             "categories": ["gpustack"]}
        )  # fmt: skip
        resources.extend(
            {"name": f"{r.name}/{sub}", "singularName": "", "namespaced": r.namespaced,
             "kind": "ModelArtifactProgress", "verbs": ["get"]}
            for sub in r.subresources
        )  # fmt: skip
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
            "resources": resources}  # fmt: skip


def _meta(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": body.get("metadata") or {}}  # fmt: skip


def column_definitions(info: ResourceInfo) -> list[dict[str, Any]]:
    name = {"name": "Name", "type": "string", "format": "name", "description": "the name",
            "priority": 0}  # fmt: skip
    return [name] + [
        {"name": c.name, "type": c.type, "format": c.format, "description": c.description,
         "priority": c.priority}
        for c in info.columns
    ]  # fmt: skip


def row(info: ResourceInfo, body: Mapping[str, Any], *, with_object: bool = True) -> dict[str, Any]:
    cells = [(body.get("metadata") or {}).get("name")] + [c.cell(body) for c in info.columns]
    out: dict[str, Any] = {"cells": cells}
    if with_object:
        out["object"] = _meta(body)
    return out


def table(
    info: ResourceInfo,
    items: Sequence[Mapping[str, Any]],
    meta: Mapping[str, Any],
    *,
    headers: bool = True,
) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of ``items`` (``headers`` False: rows only, as kubectl asks
    for on the watch events after the first)."""
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": dict(meta),
        "columnDefinitions": column_definitions(info) if headers else [],
        "rows": [row(info, b) for b in items],
    }  # fmt: skip

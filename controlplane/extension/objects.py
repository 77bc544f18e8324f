"""The extension API's documents, built from plain data: pure functions.

``gpustack.ai/v1`` serves three resources:

- ``settings`` (namespaced, system namespace only; ``Setting``, short ``set``): one per catalog
  entry, ``status`` = description, editable, sensitive and the value (``(sensitive)`` for a set
  sensitive one); ``spec.value`` is write-only;
- ``nodeutilizations`` (cluster; ``NodeUtilization``): each node's latest retained utilization
  sample, as the device agent published it on the bus;
- ``modeldownloads`` (cluster; ``ModelDownload``): each node's models not yet ready, with bytes
  done and total, from the model agents' last reports.

Lists are Kubernetes-style (``<Kind>List`` with ``metadata.resourceVersion``); a ``kubectl get``
asking for a Table gets one for settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from bus import events
from controlplane import settingscatalog
from controlplane.settingscatalog import Entry

__all__ = [
    "GROUP",
    "RESOURCES",
    "VERSION",
    "api_group",
    "api_resource_list",
    "downloads",
    "listed",
    "setting",
    "settings_table",
    "status",
    "utilization",
]

GROUP: Final = "gpustack.ai"
VERSION: Final = "v1"
GROUP_VERSION: Final = f"{GROUP}/{VERSION}"
EPOCH: Final = "1970-01-01T00:00:00Z"


class ResourceInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    singular: str
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    short: tuple[str, ...] = ()


RESOURCES: Final[Mapping[str, ResourceInfo]] = {
    r.name: r
    for r in (
        ResourceInfo(
            name="settings", singular="setting", kind="Setting", namespaced=True,
            verbs=("get", "list", "watch", "update", "patch"), short=("set",),
        ),
        ResourceInfo(
            name="nodeutilizations", singular="nodeutilization", kind="NodeUtilization",
            namespaced=False, verbs=("get", "list"),
        ),
        ResourceInfo(
            name="modeldownloads", singular="modeldownload", kind="ModelDownload",
            namespaced=False, verbs=("get", "list"),
        ),
        ResourceInfo(
            name="aggregatedinstancetypes", singular="aggregatedinstancetype",
            kind="AggregatedInstanceType", namespaced=False, verbs=("get", "list"),
            short=("ait",),
        ),
    )
}  # fmt: skip


def api_resource_list() -> dict[str, Any]:
    """``GET /apis/gpustack.ai/v1``: what ``kubectl`` discovers."""
    resources = [
        {
            "name": r.name, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": list(r.verbs), "shortNames": list(r.short), "categories": ["gpustack"],
        }
        for r in RESOURCES.values()
    ]  # fmt: skip
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
            "resources": resources}  # fmt: skip


def api_group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version],
            "preferredVersion": version}  # fmt: skip


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``metav1.Status`` failure."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


def setting(
    entry: Entry, text: str, *, namespace: str, version: str, created: str
) -> dict[str, Any]:
    """One ``Setting``; ``version`` is the store's, so a write can be made conditional on it."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "Setting",
        "metadata": {
            "name": entry.name, "namespace": namespace, "resourceVersion": version,
            "creationTimestamp": created or EPOCH,
        },
        "spec": {},
        "status": {
            "description": entry.shown_description, "editable": entry.editable,
            "sensitive": entry.sensitive, "value": settingscatalog.shown(entry, text),
        },
    }  # fmt: skip


def listed(kind: str, items: list[dict[str, Any]], version: str) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": f"{kind}List",
            "metadata": {"resourceVersion": version}, "items": items}  # fmt: skip


def settings_table(items: Iterable[dict[str, Any]], version: str) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table, for ``kubectl get settings``."""
    columns = [
        {"name": "Name", "type": "string", "format": "name", "description": "the setting"},
        {"name": "Value", "type": "string", "format": "", "description": "its value"},
        {"name": "Editable", "type": "boolean", "format": "", "description": "may be set"},
        {"name": "Description", "type": "string", "format": "", "description": "what it does",
         "priority": 1},
    ]  # fmt: skip
    rows = [
        {
            "cells": [i["metadata"]["name"], i["status"]["value"], i["status"]["editable"],
                      i["status"]["description"]],
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": i["metadata"]},
        }
        for i in items
    ]  # fmt: skip
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": version}, "columnDefinitions": columns, "rows": rows}  # fmt: skip


def _time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utilization(event: events.SamplesEvent) -> dict[str, Any]:
    """One node's latest sample, as the agent published it."""
    return {
        "apiVersion": GROUP_VERSION, "kind": "NodeUtilization",
        "metadata": {"name": event.node, "creationTimestamp": _time(event.ts)},
        "timestamp": _time(event.ts), "periodSeconds": event.period_s,
        "samples": msgspec.to_builtins(event.samples),
    }  # fmt: skip


def downloads(node: str, models: Iterable[events.ModelState]) -> dict[str, Any]:
    """One node's models that are not ready yet, with their progress."""
    out = []
    for m in models:
        if m.state not in ("pending", "downloading", "failed"):
            continue
        entry: dict[str, Any] = {"digest": m.digest or m.model, "state": m.state}
        if m.bytes_total:
            entry["sizeBytes"] = m.bytes_total
            done = m.bytes_done or 0
            entry["downloadedBytes"] = done
            entry["percent"] = min(100, done * 100 // m.bytes_total)
        if m.reason:
            entry["reason"] = m.reason
        out.append(entry)
    return {"apiVersion": GROUP_VERSION, "kind": "ModelDownload",
            "metadata": {"name": node, "creationTimestamp": EPOCH}, "models": out}  # fmt: skip

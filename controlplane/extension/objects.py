"""The documents and schemas of ``gpustack.ai/v1``: pure data and pure functions.

Four resources, declared in :data:`GROUP_VERSION_SPEC` for the API-serving core
(:mod:`controlplane.extension.core`), which gives them discovery, OpenAPI, selectors, paging,
watch, tables and the write semantics:

- ``settings`` (namespaced, system namespace only; ``Setting``, short ``set``): one per catalog
  entry; ``spec.value`` is the text (absent for a sensitive setting: write-only there);
  ``status`` = description, editable, sensitive and the value (``(sensitive)`` for a set
  sensitive one);
- ``nodeutilizations`` (cluster; ``NodeUtilization``): each node's latest retained utilization
  sample, as the device agent published it on the bus;
- ``modeldownloads`` (cluster; ``ModelDownload``): each node's models not yet ready, with bytes
  done and total, from the model agents' last reports;
- ``aggregatedinstancetypes`` (cluster; short ``ait``): the worker-gateway's aggregated InstanceTypes.

Settings carry the store's version as their ``resourceVersion``; the views carry none, and the
core's cache counts their versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from bus import events
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.clustersettings.catalog import Entry
from controlplane.extension.core.model import GroupVersion, ResourceSpec
from controlplane.extension.core.tables import Column

__all__ = [
    "GROUP",
    "GROUP_VERSION",
    "GROUP_VERSION_SPEC",
    "VERSION",
    "downloads",
    "setting",
    "utilization",
]

GROUP: Final = "gpustack.ai"
VERSION: Final = "v1"
GROUP_VERSION: Final = f"{GROUP}/{VERSION}"


def setting(
    entry: Entry, text: str, *, namespace: str, version: str, created: str
) -> dict[str, Any]:
    """One ``Setting``. ``version`` is the store's (the Secret's resourceVersion, the bus key's
    revision): every setting carries it, so every worker replica serves the same versions and a
    write conditional on one is judged alike by each (a change to any setting makes the others'
    versions stale too: the store has one version). ``created`` is the store's creation time
    (empty: unknown; the cache stamps when it first saw the setting)."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "Setting",
        "metadata": {
            "name": entry.name, "namespace": namespace,
            **({"resourceVersion": version} if version else {}),
            **({"creationTimestamp": created} if created else {}),
        },
        "spec": {} if entry.sensitive else {"value": text},
        "status": {
            "description": entry.shown_description, "editable": entry.editable,
            "sensitive": entry.sensitive, "value": settingscatalog.shown(entry, text),
        },
    }  # fmt: skip


def _time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utilization(event: events.SamplesEvent) -> dict[str, Any]:
    """One node's latest sample, as the agent published it."""
    return {
        "apiVersion": GROUP_VERSION, "kind": "NodeUtilization",
        "metadata": {"name": event.node},
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
            "metadata": {"name": node}, "models": out}  # fmt: skip


_S: Final = {"type": "string"}


def _d(schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {**schema, "description": text}


def _obj(text: str, **props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "description": text, "properties": props}


_OPEN: Final = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

SETTING_SCHEMA: Final = _obj(
    "One cluster-wide setting of gpustack-operator (docs/settings.md).",
    spec=_obj("What to set.", value=_d(_S, "The setting's text, as its rules read it. "
                                          "Write-only (never returned) for a sensitive one.")),
    status=_obj(
        "The setting as the worker reads it.",
        description=_d(_S, "What the setting does."),
        editable=_d({"type": "boolean"}, "Whether it may be changed through the API."),
        sensitive=_d({"type": "boolean"}, "Whether its value is hidden when read."),
        value=_d(_S, "The current text; (sensitive) for a set sensitive setting."),
    ),
)  # fmt: skip
UTILIZATION_SCHEMA: Final = _obj(
    "A node's latest utilization sample, as its device agent published it on the bus.",
    timestamp=_d({"type": "string", "format": "date-time"}, "When the sample was taken."),
    periodSeconds=_d({"type": "number"}, "The agent's sampling period."),
    samples={"type": "array", "description": "One entry per accelerator (the agent's fields).",
             "items": _OPEN},
)  # fmt: skip
_MODEL: Final = _obj(
    "One model that is not ready on the node.",
    digest=_d(_S, "The model's digest (or its name before it is resolved)."),
    state=_d(_S, "pending, downloading or failed."),
    sizeBytes=_d({"type": "integer"}, "The model's size, when known."),
    downloadedBytes=_d({"type": "integer"}, "Bytes already on the node."),
    percent=_d({"type": "integer"}, "downloadedBytes as a percentage of sizeBytes."),
    reason=_d(_S, "Why it failed."),
)  # fmt: skip
DOWNLOADS_SCHEMA: Final = _obj(
    "A node's models that are not ready yet, from the model agent's last report.",
    models={"type": "array", "description": "The models.", "items": _MODEL},
)  # fmt: skip
AGGREGATE_SCHEMA: Final = _obj(
    "InstanceTypes of one shape summed over the clusters a GPUStack server subscribed to the "
    "worker-gateway beside the worker.",
    spec=_d(_OPEN, "The shape (the InstanceType spec without inactive and displayName), "
                   "acceleratable, as the gateway reports it."),
    status=_d(_OPEN, "onceMaxRequest and remaining per dimension (decimal strings) over the "
                     "Active candidates, and tiers of candidates by their largest request."),
)  # fmt: skip

GROUP_VERSION_SPEC: Final = GroupVersion(group=GROUP, version=VERSION, resources=(
    ResourceSpec(
        plural="settings", singular="setting", kind="Setting", namespaced=True,
        verbs=("get", "list", "watch", "update", "patch"), short=("set",),
        categories=("gpustack",), schema=SETTING_SCHEMA, field_paths=("status.editable",),
        columns=(
            Column(name="Value", json_path=".status.value", description="its value"),
            Column(name="Editable", type="boolean", json_path=".status.editable",
                   description="may be set"),
            Column(name="Description", json_path=".status.description",
                   description="what it does", priority=1),
        ),
    ),
    ResourceSpec(
        plural="nodeutilizations", singular="nodeutilization", kind="NodeUtilization",
        namespaced=False, verbs=("get", "list"), categories=("gpustack",),
        schema=UTILIZATION_SCHEMA,
        columns=(Column(name="Sampled", json_path=".timestamp", description="when"),),
    ),
    ResourceSpec(
        plural="modeldownloads", singular="modeldownload", kind="ModelDownload",
        namespaced=False, verbs=("get", "list"), categories=("gpustack",),
        schema=DOWNLOADS_SCHEMA,
        columns=(Column(name="Models", json_path=".models[*].digest", priority=1,
                        description="the first model not ready"),),
    ),
    ResourceSpec(
        plural="aggregatedinstancetypes", singular="aggregatedinstancetype",
        kind="AggregatedInstanceType", namespaced=False, verbs=("get", "list"),
        short=("ait",), categories=("gpustack",), schema=AGGREGATE_SCHEMA,
    ),
))  # fmt: skip
"""``gpustack.ai/v1`` as the core serves it."""

"""``NodeModelStore.spec``: from the settings, the winning ``ModelStore``, and the user's edits.

Pure functions, in the order they apply:

1. :func:`from_settings`: the cluster-wide defaults (watermarks, download limits, Hub).
2. :func:`winner` / :func:`with_store`: the alphabetically first ``ModelStore`` whose
   ``spec.nodeSelector`` matches the node overrides watermarks and download limits field by field
   (an explicit ``0`` bandwidth means unlimited) and names itself in ``spec.store``.
3. :func:`keep_user_edits`: a three-way merge against what the worker last applied (kept in the
   annotation :data:`APPLIED`): a field whose observed value differs from the last applied one
   was edited by someone else and is kept; every other field follows the desired value. So a
   user's ``kubectl edit`` is never reverted, and a settings change still reaches every field
   nobody touched. An object without the annotation has no known edits (the desired spec wins).

:func:`store_statuses` computes every ``ModelStore``'s status (``nodes``, ``Ready``,
``SelectorOverlap``) from the stores and the nodes' labels.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from controlplane.clustersettings.catalog import Values
from controlplane.reconciling.planning import Desired
from controlplane.resources import Observed

__all__ = [
    "APPLIED",
    "from_settings",
    "keep_user_edits",
    "matches",
    "respec",
    "store_statuses",
    "winner",
    "with_store",
]

APPLIED: Final = "worker.gpustack.ai/applied-spec"
_MISSING: Final = object()


def from_settings(values: Values) -> dict[str, Any]:
    """The spec every node gets before any ModelStore or user edit."""
    hub: dict[str, Any] = {
        "huggingFaceEndpoint": values.model_artifact_huggingface_endpoint,
        "modelScopeEndpoint": values.model_artifact_modelscope_endpoint,
    }
    if values.model_artifact_https_proxy:
        hub["httpsProxy"] = values.model_artifact_https_proxy
    if values.model_artifact_no_proxy:
        hub["noProxy"] = values.model_artifact_no_proxy
    if values.model_artifact_ca_bundle:
        hub["caBundleConfigMap"] = values.model_artifact_ca_bundle
    return {
        "watermarks": {
            "highPercent": values.model_store_high_watermark,
            "lowPercent": values.model_store_low_watermark,
        },
        "download": {
            "concurrency": values.model_store_download_concurrency,
            "bytesPerSecond": values.model_store_download_bandwidth,
            "peerSync": values.model_store_peer_sync,
        },
        "hub": hub,
    }


def _expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = expr.get("key", ""), expr.get("operator", "")
    values = expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # an unknown operator selects nothing, as the API server would refuse it


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A ``LabelSelector``; an empty one selects every node, a missing one none."""
    if selector is None:
        return False
    wanted = selector.get("matchLabels") or {}
    if any(labels.get(k) != v for k, v in wanted.items()):
        return False
    return all(_expression(e, labels) for e in selector.get("matchExpressions") or [])


def winner(
    stores: Sequence[Mapping[str, Any]], labels: Mapping[str, str]
) -> Mapping[str, Any] | None:
    """The alphabetically first store selecting a node with ``labels``."""
    for store in sorted(stores, key=lambda s: s["metadata"]["name"]):
        if matches((store.get("spec") or {}).get("nodeSelector"), labels):
            return store
    return None


def with_store(spec: dict[str, Any], store: Mapping[str, Any] | None) -> dict[str, Any]:
    """``spec`` with the store's overrides, field by field, and its name in ``store``."""
    if store is None:
        return spec
    out: dict[str, Any] = json.loads(json.dumps(spec))
    store_spec = store.get("spec") or {}
    for part in ("watermarks", "download"):
        for key, value in (store_spec.get(part) or {}).items():
            if value is not None:
                out.setdefault(part, {})[key] = value
    out["store"] = store["metadata"]["name"]
    return out


def keep_user_edits(
    desired: Mapping[str, Any],
    observed: Mapping[str, Any] | None,
    applied: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The spec to write: ``desired``, except where ``observed`` departs from ``applied``."""
    if observed is None or applied is None:
        return dict(desired)
    return _merge(desired, observed, applied)  # type: ignore[no-any-return]


def _merge(desired: Any, observed: Any, applied: Any) -> Any:
    if isinstance(desired, dict) and isinstance(observed, dict):
        applied_d = applied if isinstance(applied, dict) else {}
        out: dict[str, Any] = {}
        # The desired keys first, in their order, then the user's additions: the same spec is
        # always the same bytes (what the agents' bucket receives is compared as bytes).
        for key in [*desired, *(k for k in observed if k not in desired)]:
            d = desired.get(key, _MISSING)
            o = observed.get(key, _MISSING)
            a = applied_d.get(key, _MISSING)
            value = _merge(d, o, a)
            if value is not _MISSING:
                out[key] = value
        return out
    if observed != applied:  # someone else set (or removed) it: theirs
        return observed
    return desired


def applied_of(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The spec the worker last applied, from the annotation; None when absent or unreadable."""
    text = (metadata.get("annotations") or {}).get(APPLIED)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def store_statuses(
    stores: Sequence[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, Any]]:
    """Each store's status: the nodes it won, and whether an earlier store took some of its own."""
    ordered = sorted(stores, key=lambda s: s["metadata"]["name"])
    won: dict[str, list[str]] = {s["metadata"]["name"]: [] for s in ordered}
    lost: dict[str, dict[str, int]] = {name: {} for name in won}
    for node, labels in sorted(nodes.items()):
        selecting = [
            s["metadata"]["name"]
            for s in ordered
            if matches((s.get("spec") or {}).get("nodeSelector"), labels)
        ]
        if selecting:
            won[selecting[0]].append(node)
            for name in selecting[1:]:
                lost[name][selecting[0]] = lost[name].get(selecting[0], 0) + 1
    out: dict[str, dict[str, Any]] = {}
    for name, nodes_won in won.items():
        overlap = lost[name]
        if overlap:
            text = ", ".join(f"{n} node(s) to {w}" for w, n in sorted(overlap.items()))
            cond = _condition("SelectorOverlap", "True", "Overlapping", f"lost {text}")
        else:
            cond = _condition("SelectorOverlap", "False", "Disjoint", "no node is shared")
        ready = _condition(
            "Ready", "True" if nodes_won else "False",
            "Selected" if nodes_won else "NoNodes", f"{len(nodes_won)} node(s)",
        )  # fmt: skip
        out[name] = {"nodes": len(nodes_won), "conditions": [ready, cond]}
    return out


def respec(desired: Desired, observed: Observed | None) -> Desired:
    """``desired`` with the user's edits of the observed spec kept, and the annotation recording
    what the worker applies now (other annotations untouched)."""
    body = observed.body if observed is not None else {}
    meta = body.get("metadata") or {}
    spec = keep_user_edits(
        desired.spec or {}, body.get("spec") if observed is not None else None, applied_of(meta)
    )
    applied = json.dumps(desired.spec or {}, sort_keys=True, separators=(",", ":"))
    annotations = {**(meta.get("annotations") or {}), APPLIED: applied}
    return msgspec.structs.replace(
        desired, spec=spec, metadata={**desired.metadata, "annotations": annotations}
    )

"""``modelartifacts/<name>/progress``: how far the nodes got with one artifact, per request.

Pure. The reference reads each downloading node's ``/model/downloads`` live (2 s a node, 13 s in
all, at most 64 nodes); here the model agents already push their download state over the bus,
at most a progress period old, and the worker's ledger holds each node's last report, so one
answer is computed from memory: no network call per request, bounded work. The node-count bound
is kept for the per-node detail: ``downloadingBytes`` and ``downloadingPercent`` sum at most
``max_live`` downloading nodes (in node-name order), and ``live`` says how many did; the counts
``ready``/``downloading``/``failed`` cover every node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

from bus import events
from controlplane.extension.workergroup import catalog

__all__ = ["MAX_LIVE", "progress"]

MAX_LIVE: Final = 64


def _step5(percent: float) -> int:
    return int(percent // 5 * 5)


def progress(
    artifact: Mapping[str, Any],
    nodes: Iterable[tuple[str, tuple[events.ModelState, ...] | None]],
    *,
    now: str,
    max_live: int = MAX_LIVE,
) -> dict[str, Any]:
    """The ``ModelArtifactProgress`` of ``artifact`` from each node's last models report."""
    meta = artifact.get("metadata") or {}
    resolved = (artifact.get("status") or {}).get("resolved") or {}
    digest = resolved.get("manifestDigest")
    counts = {"ready": 0, "downloading": 0, "failed": 0}
    reasons: Counter[str] = Counter()
    live, done_bytes, percents = 0, 0, []
    for _node, models in sorted(nodes, key=lambda n: n[0]) if digest else ():
        found = next((m for m in models or () if (m.digest or m.model) == digest), None)
        if found is None or found.state == "evicting":
            continue
        if found.state == "ready":
            counts["ready"] += 1
        elif found.state == "failed":
            counts["failed"] += 1
            reasons[found.reason or "Unknown"] += 1
        else:
            counts["downloading"] += 1
            if live < max_live:
                live += 1
                done = found.bytes_done or 0
                done_bytes += done
                if found.bytes_total:
                    percents.append(min(100.0, done * 100 / found.bytes_total))
    body: dict[str, Any] = {
        "apiVersion": catalog.GROUP_VERSION, "kind": "ModelArtifactProgress",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                     "creationTimestamp": now},
        "timestamp": now, **counts,
        "downloadingBytes": done_bytes,
        "downloadingPercent": _step5(sum(percents) / len(percents)) if percents else 0,
        "live": live,
        "failureReasons": [{"reason": r, "count": c} for r, c in sorted(reasons.items())],
    }  # fmt: skip
    if digest:
        body["manifestDigest"] = digest
    if isinstance(resolved.get("sizeBytes"), int):
        body["sizeBytes"] = resolved["sizeBytes"]
    return body

"""``NodeModelStore.status`` from the node's last ``models`` event: pure, synchronous decisions.

The status (camelCase, as the CRD in :mod:`controlplane.schema.crds` declares it):

- ``capacity``: ``totalBytes`` (the cache filesystem), ``storedBytes`` (complete models) and
  ``usedPercent`` = floor(used * 100 / total), where *used* is what the model-manager's
  watermarks compare (the filesystem's used bytes, from ``statvfs``), or ``storedBytes`` from an
  agent that does not send it. Keys the node did not report are left out.
- ``models[]``: one entry per digest (first wins; ``source`` Hub|Peer as the agent says,
  for a downloading or ready model), failed first, then downloading, then ready,
  at most :data:`MAX_MODELS` (the CRD's ``maxItems``), so a huge cache never makes the whole
  status invalid.
- ``modelCounts``: ready / downloading / failed over *all* models (printer columns).
- progress a person reads (``kubectl get nms``, never as events): each downloading model's
  ``progress`` (``42% (3.1 GiB of 7.5 GiB)``) and ``downloading``, all of them in one line
  (``sha256:0123456789ab 42% (…); …``, absent when nothing downloads); ``capacity.total`` and
  ``capacity.stored`` repeat the byte counts in binary units for the printer columns.
- ``conditions``:

  ``Ready``: ``Unknown``/``NotReported`` until the model-manager sent a ``models`` event;
  ``False``/``ModelsFailed`` while any model's last attempt failed (it keeps failing volumes
  until its backoff ends); otherwise ``True``/``Serving``.

  ``CapacityLow``: ``Unknown``/``NotReported`` without a capacity; ``True``/
  ``AboveHighWatermark`` when ``usedPercent`` ≥ the spec's ``watermarks.highPercent`` (default
  80: the model-manager collects unreferenced models, and a download that does not fit below the
  mark fails with ``InsufficientCapacity``); otherwise ``False``/``BelowHighWatermark``.

Every condition is stamped ``lastTransitionTime = now`` here;
:func:`controlplane.reconciling.planning.settle_conditions` then keeps the observed time of any
condition whose ``status`` did not flip, so an unchanged status plans no write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from bus import events
from kit.tables import human_bytes

__all__ = ["MAX_MODELS", "StoreReport", "progress", "rfc3339", "store_status"]

MAX_MODELS: Final = 256
DEFAULT_HIGH_PERCENT: Final = 80
_STATE: Final = {
    "pending": "Downloading",
    "downloading": "Downloading",
    "ready": "Ready",
    "evicting": "Ready",
    "failed": "Failed",
}
_ORDER: Final = {"Failed": 0, "Downloading": 1, "Ready": 2}


@dataclass(frozen=True)
class StoreReport:
    """The cache-wide figures of a ``models`` event (all optional on the bus)."""

    capacity_bytes: int | None = None
    stored_bytes: int | None = None
    used_bytes: int | None = None

    @classmethod
    def of(cls, event: events.ModelsEvent) -> StoreReport:
        return cls(event.capacity_bytes, event.stored_bytes, event.used_bytes)


def rfc3339(t: datetime) -> str:
    """``metav1.Time``: UTC, whole seconds, ``Z``."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def high_percent(spec: Mapping[str, Any] | None) -> int:
    value = ((spec or {}).get("watermarks") or {}).get("highPercent")
    return value if isinstance(value, int) and not isinstance(value, bool) else DEFAULT_HIGH_PERCENT


def store_status(
    models: tuple[events.ModelState, ...] | None,
    report: StoreReport | None,
    *,
    spec: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The whole desired status (see the module docstring for every rule)."""
    entries = _entries(models or ())
    capacity = _capacity(entries, report or StoreReport())
    counts = {"ready": 0, "downloading": 0, "failed": 0}
    for e in entries:
        counts[e["state"].lower()] += 1
    conditions = [
        _ready(models, entries, counts, now),
        _capacity_low(capacity, high_percent(spec), now),
    ]
    status: dict[str, Any] = {
        "models": entries[:MAX_MODELS],
        "modelCounts": counts,
        "conditions": conditions,
    }
    if capacity:
        status["capacity"] = capacity
    moving = [f"{e['digest'][:19]} {e['progress']}" for e in entries if "progress" in e]
    if moving:
        status["downloading"] = "; ".join(moving)
    return status


def progress(done: int | None, size: int | None) -> str | None:
    """``42% (3.1 GiB of 7.5 GiB)``; without a known size, just what arrived (pure)."""
    if done is None:
        return None
    if not size:
        return f"{human_bytes(done)} received"
    return f"{min(100, done * 100 // size)}% ({human_bytes(done)} of {human_bytes(size)})"


def _entries(models: Iterable[events.ModelState]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for m in models:
        entry = _model(m)
        if entry["digest"] in seen:
            continue
        seen.add(entry["digest"])
        out.append(entry)
    out.sort(key=lambda e: _ORDER[e["state"]])  # stable: the agent's order within a state
    return out


def _model(m: events.ModelState) -> dict[str, Any]:
    out: dict[str, Any] = {"digest": m.digest or m.model, "state": _STATE[m.state]}
    if m.bytes_total is not None:
        out["sizeBytes"] = max(0, m.bytes_total)
    done = m.bytes_done
    if done is None and out["state"] == "Ready":
        done = m.bytes_total  # a complete model: every byte is downloaded
    if done is not None and m.state != "failed":
        out["downloadedBytes"] = max(0, done)
    if out["state"] == "Downloading":
        text = progress(out.get("downloadedBytes"), out.get("sizeBytes"))
        if text is not None:
            out["progress"] = text
    if m.referenced is not None:
        out["referenced"] = max(0, m.referenced)
    if m.last_used is not None:
        out["lastUsedTime"] = rfc3339(m.last_used)
    if m.source is not None and m.state != "failed":
        out["source"] = m.source
    return out | _failure(m)


def _failure(m: events.ModelState) -> dict[str, Any]:
    """A failed model's ``reason``, ``message`` and ``retryTime``."""
    out: dict[str, Any] = {}
    if m.reason:
        out["reason"] = m.reason
    message = m.message
    if message and m.reason and message.startswith(f"{m.reason}: "):
        message = message[len(m.reason) + 2 :]  # the bus keeps "<reason>: " for old readers
    if message:
        out["message"] = message
    if m.retry_time is not None:
        out["retryTime"] = rfc3339(m.retry_time)
    return out


def _capacity(entries: list[dict[str, Any]], report: StoreReport) -> dict[str, Any]:
    stored = report.stored_bytes
    if stored is None:  # an agent without the capacity fields: the ready models' sizes
        sizes = [e.get("sizeBytes", 0) for e in entries if e["state"] == "Ready"]
        stored = sum(sizes) if sizes else None
    out: dict[str, Any] = {}
    total = report.capacity_bytes
    if total is not None and total > 0:
        out["totalBytes"] = total
        used = report.used_bytes if report.used_bytes is not None else stored
        if used is not None:
            out["usedPercent"] = min(100, max(0, used * 100 // total))
    if stored is not None:
        out["storedBytes"] = max(0, stored)
    for key, human in (("totalBytes", "total"), ("storedBytes", "stored")):
        if key in out:
            out[human] = human_bytes(out[key])
    return out


def _condition(kind: str, status: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(now),
    }


def _ready(
    models: tuple[events.ModelState, ...] | None,
    entries: list[dict[str, Any]],
    counts: Mapping[str, int],
    now: datetime,
) -> dict[str, Any]:
    if models is None:
        return _condition(
            "Ready", "Unknown", "NotReported", "the model-manager has not reported yet", now
        )
    failed = [e for e in entries if e["state"] == "Failed"]
    if failed:
        named = ", ".join(f"{e['digest'][:19]}… ({e.get('reason', 'Failed')})" for e in failed[:3])
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        return _condition(
            "Ready", "False", "ModelsFailed", f"{len(failed)} failed: {named}{more}", now
        )
    message = f"{counts['ready']} ready, {counts['downloading']} downloading"
    return _condition("Ready", "True", "Serving", message, now)


def _capacity_low(capacity: Mapping[str, int], high: int, now: datetime) -> dict[str, Any]:
    used = capacity.get("usedPercent")
    if used is None:
        return _condition(
            "CapacityLow", "Unknown", "NotReported", "the cache capacity is not reported", now
        )
    message = f"{used}% of the cache filesystem used; the high watermark is {high}%"
    if used >= high:
        return _condition("CapacityLow", "True", "AboveHighWatermark", message, now)
    return _condition("CapacityLow", "False", "BelowHighWatermark", message, now)

"""``bus watch -o wide``: one kubectl-style table row per event (pure).

Columns ``TIME NODE KIND SUMMARY``; the summary is what a person scanning the stream wants of
each kind (a count and a product rather than a list of UUIDs, sizes in human units). The
header is printed once; widths are fixed ahead (a stream has no end to fit them to).
"""

from __future__ import annotations

from datetime import UTC
from typing import Final

from bus import events
from bus.devices import MonitorSample
from kit.tables import NONE, human_bytes, human_mib, row

__all__ = ["HEADER", "summary", "wide_row"]

_WIDTHS: Final = (20, 30, 11)
HEADER: Final = row(("TIME", "NODE", "KIND", "SUMMARY"), _WIDTHS)


def wide_row(event: events.Event) -> str:
    """The event as one table line."""
    ts = event.ts if event.ts.tzinfo is not None else event.ts.replace(tzinfo=UTC)
    when = ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return row((when, event.node, events.kind_of(event), summary(event)), _WIDTHS)


def summary(event: events.Event) -> str:
    """What changed or stands, in a few words."""
    if isinstance(event, events.DevicesEvent):
        return _devices(event)
    if isinstance(event, events.SamplesEvent):
        return "; ".join(_sample(s) for s in event.samples) or "no accelerators"
    if isinstance(event, events.HealthEvent):
        state = "healthy" if event.healthy else "UNHEALTHY"
        xid = f" xid={event.xid}" if event.xid is not None else ""
        return f"{event.accelerator_id} {state} {event.reason}{xid}"
    if isinstance(event, events.AllocationEvent):
        pod = "/".join(p for p in (event.pod_namespace, event.pod_name, event.container) if p)
        held = f"{len(event.device_ids)} device(s)"
        return f"{event.action} {event.resource} {held} {pod or NONE}"
    if isinstance(event, events.ModelsEvent):
        return _models(event)
    up = event.started_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"version {event.version}, up since {up}, heartbeat {event.heartbeat_s:g}s"


def _devices(event: events.DevicesEvent) -> str:
    parts = []
    for g in event.groups:
        down = sum(a.status.unhealthy for a in g.accelerators)
        text = f"{len(g.accelerators)} x {g.name} ({human_mib(g.memory)} each)"
        parts.append(text + (f", {down} unhealthy" if down else ""))
    return "; ".join(parts) or "no accelerators"


def _sample(s: MonitorSample) -> str:
    accels = s.accelerators
    used = sum(a.memory_usage or 0 for a in accels)
    total = sum(a.memory or 0 for a in accels)
    utils = [a.cores_utilization for a in accels if a.cores_utilization is not None]
    temps = [a.temperature for a in accels if a.temperature is not None]
    power = [a.power_usage for a in accels if a.power_usage is not None]
    parts = [f"{len(accels)} {s.manufacturer}"]
    if utils:
        parts.append(f"util {sum(utils) / len(utils):.0f}%")
    if total:
        parts.append(f"memory {human_mib(used)}/{human_mib(total)}")
    if temps:
        parts.append(f"max {max(temps)}C")
    if power:
        parts.append(f"{sum(power)} W")
    down = sum(a.unhealthy for a in accels)
    if down:
        parts.append(f"{down} unhealthy")
    return ", ".join(parts)


def _models(event: events.ModelsEvent) -> str:
    counts: dict[str, int] = {}
    for m in event.models:
        counts[m.state] = counts.get(m.state, 0) + 1
    text = ", ".join(f"{n} {state}" for state, n in counts.items()) or "no models"
    moving = [m for m in event.models if m.state == "downloading" and m.bytes_total]
    done = sum(m.bytes_done or 0 for m in moving)
    total = sum(m.bytes_total or 0 for m in moving)
    if total:
        text += f" ({human_bytes(done)} of {human_bytes(total)}, {100 * done // total}%)"
    if event.stored_bytes is not None:
        text += f"; stored {human_bytes(event.stored_bytes)}"
    if event.capacity_bytes:
        text += f" of {human_bytes(event.capacity_bytes)}"
    return text

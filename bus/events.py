"""The event contract: one tagged union of frozen msgspec Structs, JSON on the wire.

Every event carries ``kind`` (the union tag, equal to the subject's last token), ``v`` (the
schema version, 1 here), ``node`` (the Kubernetes node name, unescaped) and ``ts`` (when it was
produced, RFC 3339 UTC). Device shapes are reused from :mod:`bus.devices`, never redefined.

Compatibility rules, also in ``docs/bus.md``:

- adding an optional field is compatible: decoders ignore fields they do not know;
- removing or retyping a field, or changing a meaning, bumps ``v`` and the ``v1`` subject token;
- a decoder drops (and counts) events whose ``v`` it does not speak.

State events (everything except ``samples``) are coalesced per :func:`state_key` while the
publisher is disconnected, so a key must name "the thing whose latest state this is".
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from bus.bounds import ALLOCATION_DEVICES, Bytes, Mib, Name, Percent, Seconds, Text, Units
from bus.devices import DeviceGroup, MonitorSample
from bus.subjects import Kind

__all__ = [
    "VERSION",
    "AgentEvent",
    "AllocationEvent",
    "CardCharge",
    "DevicesEvent",
    "Event",
    "HealthEvent",
    "ModelState",
    "ModelsEvent",
    "SamplesEvent",
    "WaitingPod",
    "kind_of",
    "now",
    "state_key",
]

VERSION: Final = 1


def now() -> datetime:
    """The current time, timezone-aware UTC, as every event timestamp is."""
    return datetime.now(UTC)


class _Event(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag_field="kind", omit_defaults=False
):
    """Fields every event carries. ``v`` is always encoded so a decoder can refuse versions."""

    v: int = VERSION
    """Schema version. Decoders drop events whose ``v`` is not the one they speak."""
    node: Annotated[str, Meta(max_length=253)]
    """The Kubernetes node name, as in ``metadata.name`` (not escaped)."""
    ts: datetime = msgspec.field(default_factory=now)
    """When the event was produced on the node (RFC 3339, UTC)."""


class DevicesEvent(_Event, tag="devices", frozen=True, kw_only=True):
    """The full ``Devices`` spec of a node: sent on every change and re-sent periodically."""

    groups: Annotated[tuple[DeviceGroup, ...], Meta(max_length=256)] = ()


class SamplesEvent(_Event, tag="samples", frozen=True, kw_only=True):
    """One monitor sample per manufacturer, sent every period."""

    period_s: Seconds
    """The sampling period; a dashboard may treat a node silent for 3 periods as stale."""
    samples: Annotated[tuple[MonitorSample, ...], Meta(max_length=256)] = ()


class HealthEvent(_Event, tag="health", frozen=True, kw_only=True):
    """A health transition of one accelerator; after a reconnect, also a restatement of a card
    that is down now (the server may have lost the history): treat a repeat as no change."""

    accelerator_id: Name
    healthy: bool
    reason: Name
    """Short machine-readable cause, e.g. ``XID``, ``ECC``, ``LOST``, ``RECOVERED``."""
    xid: Annotated[int, Meta(ge=0, le=2**32 - 1)] | None = None
    """The NVIDIA XID code when ``reason`` is ``XID``."""
    message: Text | None = None


class CardCharge(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The units one allocation holds on one card (a card is 1,600,000 units)."""

    accelerator_id: Name
    units: Units


class AllocationEvent(_Event, tag="allocations", frozen=True, kw_only=True):
    """A change of the device plugin's ledger: devices given to, or taken back from, a container."""

    allocation_id: Annotated[str, Meta(max_length=512)]
    """Stable id of the allocation (pod UID and container name); the coalescing key."""
    action: Literal["allocated", "released"]
    resource: Name
    """The extended resource, e.g. ``nvidia.com/gpu``."""
    device_ids: Annotated[tuple[Name, ...], Meta(max_length=ALLOCATION_DEVICES)] = ()
    pod_namespace: Name | None = None
    pod_name: Name | None = None
    container: Name | None = None
    pod_uid: Name | None = None
    """The Pod's ``metadata.uid`` when the agent knows which container it served (the pending
    record it matched). Optional, added in v1."""
    charges: Annotated[tuple[CardCharge, ...], Meta(max_length=1024)] = ()
    """The units the ledger charged per card; empty from an agent that predates the field (the
    reader then derives them from the tokens). Optional, added in v1."""
    memory_mib: Mib | None = None
    """Sliced: the memory cap injected on each card, in MiB. Optional, added in v1."""
    cores_percentage: Percent | None = None
    """Sliced: the SM/CU cap injected, in percent. Optional, added in v1."""
    profile: Name | None = None
    """Partitioned: the instance's profile (``3g.40gb``). Optional, added in v1."""
    partition_id: Name | None = None
    """Partitioned: the instance's id (a ``MIG-`` UUID). Optional, added in v1."""


class WaitingPod(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A Pod whose volume waits for a model's download (kubelet names it on NodePublishVolume)."""

    namespace: Name
    name: Name
    uid: Name | None = None


class ModelState(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One model in a node's cache and how far its download got."""

    model: Annotated[str, Meta(max_length=1024)]
    """The model reference, e.g. ``hf://Qwen/Qwen3-8B@main``; the model-manager, which never
    learns a repository, puts the manifest digest here (``sha256:<hex>``)."""
    state: Literal["pending", "downloading", "ready", "failed", "evicting"]
    bytes_done: Bytes | None = None
    bytes_total: Bytes | None = None
    message: Text | None = None
    """Human-readable detail; for ``failed``, ``"<reason>: <detail>"``."""
    digest: Name | None = None
    """The canonical manifest digest (``sha256:<64 hex>``) when known. Optional, added in v1."""
    referenced: Annotated[int, Meta(ge=0, le=2**31 - 1)] | None = None
    """How many mounts use the model right now (a referenced model is never collected)."""
    last_used: datetime | None = None
    """When a volume of it was last mounted or unmounted (collection removes the oldest first)."""
    reason: Name | None = None
    """Machine-readable cause of ``failed``, e.g. ``IntegrityMismatch``, ``SourceUnavailable``."""
    retry_time: datetime | None = None
    """For ``failed``: no new attempt starts before this time (the persisted backoff)."""
    waiting_pods: Annotated[tuple[WaitingPod, ...], Meta(max_length=1024)] | None = None
    """For ``downloading``: the Pods whose volumes wait for it (asked within the last
    ``waiter_window_s``), so the worker can tell them how far it got. Optional, added in v1."""
    source: Literal["Hub", "Peer"] | None = None
    """Where most of its bytes came from: the model hub or peer model agents (NodeModelStore
    ``status.models[].source``). Optional, added in v1."""


class ModelsEvent(_Event, tag="models", frozen=True, kw_only=True):
    """The whole model cache of a node, so the last message alone is the node's cache state."""

    models: Annotated[tuple[ModelState, ...], Meta(max_length=16384)] = ()
    capacity_bytes: Bytes | None = None
    """Size of the cache's filesystem (``statvfs`` of the cache root). Optional, added in v1."""
    stored_bytes: Bytes | None = None
    """Bytes of the published (complete) models in the cache."""
    used_bytes: Bytes | None = None
    """Bytes used on the cache's filesystem by anything (root-reserved blocks count as used):
    what the collection watermarks compare with ``capacity_bytes``."""


class AgentEvent(_Event, tag="agent", frozen=True, kw_only=True):
    """An agent's liveness record, sent at start and every ``heartbeat_s``."""

    version: Name
    capabilities: Annotated[tuple[Name, ...], Meta(max_length=64)] = ()
    started_at: datetime
    heartbeat_s: Seconds
    """A dashboard may treat an agent silent for 3 heartbeats as gone."""


Event = DevicesEvent | SamplesEvent | HealthEvent | AllocationEvent | ModelsEvent | AgentEvent
"""Every event on the bus. Decode with one decoder for this union (see :mod:`bus.codec`)."""

_KIND: Final[dict[type[_Event], Kind]] = {
    DevicesEvent: "devices",
    SamplesEvent: "samples",
    HealthEvent: "health",
    AllocationEvent: "allocations",
    ModelsEvent: "models",
    AgentEvent: "agent",
}


def kind_of(event: Event) -> Kind:
    """The event's kind: its union tag and the last token of its subject."""
    return _KIND[type(event)]


def state_key(event: Event) -> str:
    """What the event is the latest state of, within its node and kind.

    Empty for events that describe the whole node (devices, models, agent, samples).
    """
    if isinstance(event, HealthEvent):
        return event.accelerator_id
    if isinstance(event, AllocationEvent):
        return event.allocation_id
    return ""

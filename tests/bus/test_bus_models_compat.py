"""The ``models`` payload grew optional fields in v1: old and new peers must still understand
each other (docs/bus.md, *Versioning and compatibility*)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

import msgspec

from bus import codec, events

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DIGEST = "sha256:" + "a" * 64


def decode(wire: bytes) -> events.Event:
    """The subscriber's decoder (version, kind and node checks included)."""
    return codec.decode(wire, kind="models", node="n1", max_bytes=1 << 20)


class OldModelState(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A copy of ``ModelState`` as it was before the optional fields were added."""

    model: str
    state: Literal["pending", "downloading", "ready", "failed", "evicting"]
    bytes_done: int | None = None
    bytes_total: int | None = None
    message: str | None = None


class OldModelsEvent(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag_field="kind", tag="models"
):
    """A copy of ``ModelsEvent`` (with the common fields) as it was before."""

    v: int = 1
    node: str
    ts: datetime
    models: tuple[OldModelState, ...] = ()


OLD_WIRE = (
    b'{"kind":"models","v":1,"node":"n1","ts":"2026-01-01T00:00:00Z","models":'
    b'[{"model":"' + DIGEST.encode() + b'","state":"ready","bytesDone":null,"bytesTotal":5,'
    b'"message":null}]}'
)


def test_an_old_models_event_still_decodes() -> None:
    event = decode(OLD_WIRE)

    assert isinstance(event, events.ModelsEvent)
    assert event.v == 1 and event.node == "n1"
    (model,) = event.models
    assert (model.model, model.state, model.bytes_total) == (DIGEST, "ready", 5)
    assert (model.digest, model.referenced, model.last_used, model.reason) == (None,) * 4
    assert (event.capacity_bytes, event.stored_bytes, event.used_bytes) == (None, None, None)


def test_a_new_models_event_decodes_with_an_old_decoder() -> None:
    new = events.ModelsEvent(
        node="n1",
        ts=T0,
        capacity_bytes=1000,
        stored_bytes=5,
        used_bytes=700,
        models=(
            events.ModelState(
                model=DIGEST,
                digest=DIGEST,
                state="failed",
                message="IntegrityMismatch: bad",
                referenced=0,
                last_used=T0,
                reason="IntegrityMismatch",
                retry_time=T0,
            ),
        ),
    )
    wire = codec.encode(new)

    old = msgspec.json.decode(wire, type=OldModelsEvent)

    assert (old.v, old.node, old.ts) == (1, "n1", T0)
    assert old.models == (
        OldModelState(model=DIGEST, state="failed", message="IntegrityMismatch: bad"),
    )
    assert decode(wire) == new


def test_new_fields_are_camel_case_on_the_wire() -> None:
    event = events.ModelsEvent(
        node="n1",
        ts=T0,
        capacity_bytes=1,
        models=(events.ModelState(model=DIGEST, state="ready", last_used=T0, retry_time=T0),),
    )
    doc = msgspec.json.decode(codec.encode(event))

    assert doc["capacityBytes"] == 1 and "storedBytes" in doc and "usedBytes" in doc
    assert doc["models"][0]["lastUsed"] == "2026-01-01T00:00:00Z"
    assert {"digest", "referenced", "reason", "retryTime"} <= set(doc["models"][0])


def test_waiting_pods_are_optional_and_ignored_by_an_old_decoder() -> None:
    pod = events.WaitingPod(namespace="team-a", name="llm-0", uid="u-1")
    new = events.ModelsEvent(
        node="n1",
        ts=T0,
        models=(
            events.ModelState(
                model=DIGEST, state="downloading", bytes_done=1, bytes_total=4, waiting_pods=(pod,)
            ),
        ),
    )
    wire = codec.encode(new)

    doc = msgspec.json.decode(wire)
    old = msgspec.json.decode(wire, type=OldModelsEvent)

    assert doc["models"][0]["waitingPods"] == [
        {"namespace": "team-a", "name": "llm-0", "uid": "u-1"}
    ]
    assert old.models == (
        OldModelState(model=DIGEST, state="downloading", bytes_done=1, bytes_total=4),
    )
    assert decode(wire) == new
    assert decode(OLD_WIRE).models[0].waiting_pods is None  # type: ignore[union-attr]

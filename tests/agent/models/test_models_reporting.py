"""What the model-manager tells the bus: capacity, references, last use, failure reason, retry."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import anyio
import anyio.to_thread
import msgspec
import pytest
from models_harness import Rig, code_of, publish_request, publish_until_done, settled, unpublish

from agent.models import layout, reporting
from agent.models.backoff import Failure
from agent.models.jobs import Pod
from agent.models.volumes import POD_NAME, POD_UID
from bus import events

pytestmark = pytest.mark.anyio
H = [c * 64 for c in "abc"]


def test_snapshot_carries_capacity_references_and_failure_details() -> None:
    facts = reporting.Facts(
        published={H[0]: 10, H[1]: 5},
        failures={
            H[2]: layout.DigestRecord(
                reason="IntegrityMismatch", message="bad", retry_at=1_767_225_660.0
            )
        },
        jobs={},
        references={H[0]: 2},
        last_used={H[0]: 1_767_225_600.0, H[1]: 0.0},
        used_bytes=700,
        capacity_bytes=1000,
    )

    event = reporting.snapshot("node-1", facts)

    assert (event.capacity_bytes, event.stored_bytes, event.used_bytes) == (1000, 15, 700)
    ready, idle, failed = event.models
    assert ready.digest == ready.model == "sha256:" + H[0]
    assert ready.referenced == 2
    assert ready.last_used == datetime(2026, 1, 1, tzinfo=UTC)
    assert (idle.referenced, idle.last_used) == (0, None)
    assert (failed.state, failed.reason, failed.message) == (
        "failed",
        "IntegrityMismatch",
        "IntegrityMismatch: bad",
    )
    assert failed.retry_time == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


def test_a_download_names_the_pods_waiting_for_it() -> None:
    pods = (Pod("team-a", "llm-0", "u-0"), Pod("team-b", "llm-1"))
    facts = reporting.Facts(
        published={H[1]: 5}, failures={}, jobs={H[0]: (1, 4), H[1]: (5, 5)}, waiting={H[0]: pods}
    )

    downloading, ready = sorted(reporting.snapshot("node-1", facts).models, key=lambda m: m.state)

    assert (downloading.state, downloading.bytes_done, downloading.bytes_total) == (
        "downloading",
        1,
        4,
    )
    assert downloading.waiting_pods == (
        events.WaitingPod(namespace="team-a", name="llm-0", uid="u-0"),
        events.WaitingPod(namespace="team-b", name="llm-1"),
    )
    assert (ready.state, ready.waiting_pods) == ("ready", None)


async def test_a_pod_starting_to_wait_is_reported_at_once(rig: Rig) -> None:
    record = rig.artifact("org/model", {"config.json": b"{}"})
    rig.hub.gate = anyio.Event()
    first = publish_request(record, rig.target(pod="pod-1"), **{POD_UID: "u-1"})
    second = publish_request(
        record, rig.target(pod="pod-2"), volume_id="csi-2", **{POD_NAME: "pod-2", POD_UID: "u-2"}
    )

    async with rig.running() as plugin:
        await code_of(plugin.socket, first)
        await plugin.reporter.report_once()
        await code_of(plugin.socket, second)
        rig.sink.events.clear()
        await plugin.reporter.report_once()  # only the waiting pods changed: published at once
        sent = list(rig.sink.events)
        rig.hub.gate.set()
        await settled(plugin)
        await plugin.reporter.report_once()
        after = plugin.reporter.last

    (event,) = sent
    assert isinstance(event, events.ModelsEvent)
    (model,) = event.models
    assert model.state == "downloading"
    assert [(p.namespace, p.name, p.uid) for p in model.waiting_pods or ()] == [
        ("team-a", "pod-1", "u-1"),
        ("team-a", "pod-2", "u-2"),
    ]
    assert after is not None
    assert [(m.state, m.waiting_pods) for m in after.models] == [("ready", None)]


@pytest.mark.usefixtures("mounts")
async def test_a_mount_is_reported_as_a_reference_and_a_use(rig: Rig) -> None:
    record = rig.artifact("org/model", {"config.json": b"{}"})
    target = rig.target()
    request = publish_request(record, target)

    async with rig.running() as plugin:
        await publish_until_done(plugin.socket, request)
        await plugin.reporter.report_once()
        mounted = plugin.reporter.last
        await unpublish(plugin.socket, "csi-abc", target)
        await plugin.reporter.report_once()
        unmounted = plugin.reporter.last

    assert mounted is not None and unmounted is not None
    (model,) = mounted.models
    assert (model.digest, model.state, model.referenced) == (record.manifest_digest, "ready", 1)
    assert model.last_used is not None
    assert mounted.capacity_bytes and mounted.capacity_bytes > 0
    assert mounted.used_bytes is not None and 0 < mounted.used_bytes <= mounted.capacity_bytes
    assert mounted.stored_bytes == model.bytes_total
    assert unmounted.models[0].referenced == 0
    assert unmounted.models[0].last_used is not None
    assert unmounted.models[0].last_used >= model.last_used


async def test_a_failure_is_reported_with_its_reason_and_retry_time(rig: Rig) -> None:
    record = rig.artifact("org/model", {"config.json": b"{}", "w.bin": b"x" * 100})
    rig.hub.corrupt.add("w.bin")

    async with rig.running() as plugin:
        await code_of(plugin.socket, publish_request(record, rig.target()))
        await settled(plugin)
        await plugin.reporter.report_once()
        event = plugin.reporter.last

    assert event is not None
    (model,) = event.models
    assert (model.state, model.reason) == ("failed", "IntegrityMismatch")
    assert model.retry_time is not None and model.retry_time > datetime.now(UTC)
    assert event.stored_bytes == 0


async def test_an_ending_attempt_stays_reported_until_its_outcome_is_recorded(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = rig.artifact("org/model", {"config.json": b"{}", "w.bin": b"x" * 100})
    rig.hub.corrupt.add("w.bin")
    recording, release = threading.Event(), threading.Event()

    async with rig.running() as plugin:
        materializer = plugin.materializer
        save = materializer._settle

        async def held_settle(hex_: str, failures: dict[str, Failure]) -> None:
            recording.set()
            await anyio.to_thread.run_sync(release.wait, 10)
            await save(hex_, failures)

        monkeypatch.setattr(materializer, "_settle", held_settle)
        try:
            await code_of(plugin.socket, publish_request(record, rig.target()))
            await anyio.to_thread.run_sync(recording.wait, 10)
            # The attempt has failed and its outcome is not on disk yet: still downloading.
            await plugin.reporter.report_once()
            during = plugin.reporter.last
        finally:
            release.set()
        await settled(plugin)
        await plugin.reporter.report_once()
        after = plugin.reporter.last

    assert during is not None and after is not None
    assert [m.state for m in during.models] == ["downloading"]
    assert [(m.state, m.reason) for m in after.models] == [("failed", "IntegrityMismatch")]


async def test_an_unchanged_state_goes_out_again_every_resync_and_on_a_reconnect(rig: Rig) -> None:
    """The bus expires retained state nobody republishes, and a server may lose it."""
    async with rig.running() as plugin:
        await plugin.reporter.report_once()
        sent = len(rig.sink.events)
        await plugin.reporter.report_once()
        assert len(rig.sink.events) == sent  # unchanged, and the resync is minutes away
        plugin.reporter.republish()  # what the publisher calls after a reconnect
        assert rig.sink.events[sent:] == [plugin.reporter.last]
        plugin.reporter.tuning = msgspec.structs.replace(plugin.reporter.tuning, resync_s=0.0)
        await plugin.reporter.report_once()
        assert len(rig.sink.events) >= sent + 2

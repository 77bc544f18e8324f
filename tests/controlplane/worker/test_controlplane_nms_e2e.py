"""model-manager-shaped ``models`` events -> real nats-server -> worker -> NodeModelStore.status."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node
from test_controlplane_nms_status import VALIDATOR

from bus import codec, connection, events, subjects
from bus.testing import eventually, nats_server, settings_for
from controlplane.k8s.client import KubeSettings
from controlplane.worker import leading, running
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NMS = "apis/worker.gpustack.ai/v1alpha1/nodemodelstores"
D = ["sha256:" + c * 64 for c in "ab"]


def settings(bus: object, api_url: str) -> running.WorkerSettings:
    return running.WorkerSettings(
        concurrency=16,
        bus=bus,  # type: ignore[arg-type]
        kube=KubeSettings.for_tests(api_url, backoff_s=0.01),
        https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
        leader=leading.LeaderSettings(name="w", namespace="ns", lease_s=1.0, renew_timeout_s=0.6),
        identity="w1",
        resync_s=0.3,
    )


def models_event(ts: datetime, *, done: int, used: int, failed: bool = False) -> events.ModelsEvent:
    """What agent.models.reporting.snapshot publishes (the shape, built here by hand)."""
    ready = events.ModelState(model=D[0], digest=D[0], state="ready", bytes_total=4096,
                              referenced=1, last_used=T0)  # fmt: skip
    if failed:
        other = events.ModelState(model=D[1], digest=D[1], state="failed", referenced=0,
                                  message="InsufficientCapacity: no room",
                                  reason="InsufficientCapacity", retry_time=T0 + timedelta(minutes=1))  # fmt: skip
    else:
        other = events.ModelState(model=D[1], digest=D[1], state="downloading", referenced=0,
                                  bytes_done=done, bytes_total=8192)  # fmt: skip
    return events.ModelsEvent(node="n1", ts=ts, models=(ready, other), capacity_bytes=10_000,
                              stored_bytes=4096, used_bytes=used)  # fmt: skip


async def publish(bus: object, event: events.Event) -> None:
    async with connection.connect(bus, name="model-manager/n1") as conn:  # type: ignore[arg-type]
        await conn.publish(subjects.subject(event.node, events.kind_of(event)), codec.encode(event))
        await conn.flush()


def status(fake: FakeApi) -> dict[str, Any]:
    obj = fake.objects.get((NMS, None, "n1")) or {}
    return obj.get("status") or {}


async def until(check: Callable[[], bool]) -> None:
    async def checked() -> bool:
        try:
            return check()
        except (KeyError, IndexError, StopIteration):
            return False

    await eventually(checked)


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in st.get("conditions", []) if c["type"] == kind)


async def test_models_events_become_the_node_model_store_status(tmp_path: Path) -> None:
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        bus = settings_for(server)
        fake.put_object("api/v1/nodes", node("n1"))
        await tg.start(running.run, settings(bus, url))

        await publish(bus, models_event(T0, done=100, used=5_000))
        await until(lambda: status(fake).get("modelCounts", {}).get("downloading") == 1)
        first = status(fake)
        await publish(bus, models_event(T0 + timedelta(seconds=1), done=200, used=5_100))
        await until(lambda: status(fake)["models"][0].get("downloadedBytes") == 200)
        progressed = status(fake)
        writes = fake.object_writes[(NMS, None, "n1")]
        await publish(bus, models_event(T0 + timedelta(seconds=1), done=200, used=5_100))
        await publish(bus, models_event(T0 + timedelta(seconds=2), done=0, used=8_500, failed=True))
        await until(lambda: condition(status(fake), "Ready")["status"] == "False")
        failed = status(fake)
        patches = fake.object_writes[(NMS, None, "n1")] - writes
        tg.cancel_scope.cancel()

    assert first["capacity"] == {"totalBytes": 10_000, "storedBytes": 4096, "usedPercent": 50,
                                 "stored": "4.0 KiB", "total": "9.8 KiB"}  # fmt: skip
    assert first["models"][0] == {"digest": D[1], "state": "Downloading", "sizeBytes": 8192,
                                  "downloadedBytes": 100, "referenced": 0,
                                  "progress": "1% (100 B of 8.0 KiB)"}  # fmt: skip
    assert first["models"][1] == {"digest": D[0], "state": "Ready", "sizeBytes": 4096,
                                  "downloadedBytes": 4096, "referenced": 1,
                                  "lastUsedTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    assert condition(first, "Ready")["status"] == "True"
    assert condition(first, "CapacityLow")["status"] == "False"
    # progress rewrote the status but no condition flipped: transition times are kept
    assert progressed["conditions"] == [
        {**c, "message": condition(progressed, c["type"])["message"]} for c in first["conditions"]
    ]
    # the duplicate wrote nothing; the failure is one status patch flipping both conditions
    assert patches == 1
    assert condition(failed, "CapacityLow")["status"] == "True"
    assert condition(failed, "CapacityLow")["reason"] == "AboveHighWatermark"
    assert condition(failed, "Ready")["reason"] == "ModelsFailed"
    assert failed["models"][0] == {"digest": D[1], "state": "Failed", "referenced": 0,
                                   "reason": "InsufficientCapacity", "message": "no room",
                                   "retryTime": "2026-01-01T00:01:00Z"}  # fmt: skip
    for st in (first, progressed, failed):
        obj = {**msgspec.json.decode(msgspec.json.encode(fake.get(NMS, "n1"))), "status": st}
        obj["metadata"] = {"name": "n1"}
        VALIDATOR.validate(obj)

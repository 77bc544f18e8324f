"""The audit log's writer: an event recorded before its response went out is written, also when
the worker stops (its task group cancelled) before the writer took the event from the queue."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from aiohttp.test_utils import make_mocked_request

from controlplane.extension.audit import Auditor, AuditSettings

pytestmark = pytest.mark.anyio


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_events_queued_when_a_stopping_worker_cancels_the_writer_are_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.log"
    auditor = Auditor(AuditSettings(log_path=str(path)))
    with anyio.CancelScope() as scope:
        async with auditor.running():
            for n in range(3):
                auditor.record(make_mocked_request("GET", f"/apis/x/{n}"), 200, "t")
            scope.cancel()  # before the writer ran once: every event is still queued
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert [e["requestURI"] for e in _lines(path)] == ["/apis/x/0", "/apis/x/1", "/apis/x/2"]


async def test_a_queue_longer_than_a_batch_is_written_whole_and_in_order(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    auditor = Auditor(AuditSettings(log_path=str(path)))
    async with auditor.running():
        for n in range(250):  # more than two batches, left by the block without a wait
            auditor.record(make_mocked_request("PATCH", f"/apis/x/{n}"), 200, "t")
    uris = [e["requestURI"] for e in _lines(path)]
    assert uris == [f"/apis/x/{n}" for n in range(250)]

"""The ledger under concurrency and faults: records stay whole and a job's bookkeeping never kills
the plugin."""

from __future__ import annotations

import os
import shutil
import threading
from collections import Counter
from functools import partial
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import grpc
import pytest
from models_harness import FILES, Rig, code_of, publish_request, publish_until_done, settled
from models_harness import publish as publish_once
from models_harness import unpublish as unpublish_once

from agent.models import layout, mounting
from agent.models.errors import BackingOff, Materializing
from agent.models.jobs import Source
from bus.records import ArtifactRecord

pytestmark = pytest.mark.anyio

HEX = "ab" * 32


def _in_threads(n: int, work: partial[object]) -> list[BaseException]:
    """Run ``work`` in ``n`` threads released together; returns what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def one() -> None:
        start.wait()
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _save_many(cache: layout.Cache, times: int) -> None:
    for i in range(times):
        cache.save_digest(HEX, layout.DigestRecord(last_used=float(i)))


def test_concurrent_writes_of_one_digest_record_neither_fail_nor_leave_temp_files(
    tmp_path: Path,
) -> None:
    cache = layout.Cache.open(tmp_path / "cache")

    errors = _in_threads(8, partial(_save_many, cache, 20))

    assert errors == []
    assert sorted(p.name for p in cache.digests.iterdir()) == [f"{HEX}.json"]
    assert cache.load_digest(HEX).last_used == 19.0


def test_a_failed_write_leaves_the_old_record_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = layout.Cache.open(tmp_path / "cache")
    cache.save_digest(HEX, layout.DigestRecord(last_used=1.0))

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output"):
        cache.save_digest(HEX, layout.DigestRecord(last_used=2.0))
    monkeypatch.undo()

    assert sorted(p.name for p in cache.digests.iterdir()) == [f"{HEX}.json"]
    assert cache.load_digest(HEX).last_used == 1.0


def _count_up(cache: layout.Cache, times: int) -> None:
    for _ in range(times):
        cache.update_digest(HEX, lambda r: layout.DigestRecord(last_attempt=r.last_attempt + 1))


def test_updates_of_one_digest_record_are_serialized(tmp_path: Path) -> None:
    cache = layout.Cache.open(tmp_path / "cache")

    errors = _in_threads(8, partial(_count_up, cache, 10))

    assert errors == []
    assert cache.load_digest(HEX).last_attempt == 80


async def test_a_failed_job_records_its_backoff_before_it_ends(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    rig.hub.corrupt.add("model-00002.safetensors")
    hex_ = (record.manifest_digest or "")[7:]
    source = Source(record.source.repository, record.revision or "", None)

    async with rig.running() as plugin:
        with anyio.fail_after(20):
            while True:  # a tight retry loop: it must never see the job gone but not recorded
                try:
                    plugin.materializer.ensure(hex_, source)
                except Materializing:
                    await anyio.lowlevel.checkpoint()
                except BackingOff:
                    break

    corrupt_gets = [s for s in rig.hub.seen if s.path.endswith("/model-00002.safetensors")]
    assert len(corrupt_gets) == 1


def _break_ledger(cache: layout.Cache) -> None:
    """Replace the digest ledger by a file: every record write fails (root ignores modes)."""
    shutil.rmtree(cache.digests)
    cache.digests.write_bytes(b"not a directory")


async def test_a_ledger_that_cannot_be_written_fails_the_job_not_the_plugin(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    target = rig.target()

    async with rig.running() as plugin:
        await anyio.to_thread.run_sync(_break_ledger, plugin.cache)
        first, _ = await code_of(plugin.socket, publish_request(record, target))
        await settled(plugin)
        code, message = await code_of(plugin.socket, publish_request(record, target))
        still_serving = plugin.volumes.ready

    assert first == grpc.StatusCode.ABORTED
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "cache I/O failed" in message
    assert still_serving


async def test_eight_pods_retrying_a_bad_model_never_stop_the_plugin(rig: Rig) -> None:
    record = rig.artifact("org/bad", FILES)
    rig.hub.repos["org/bad"].extra_entries = [{"type": "file", "path": "../x", "oid": "0" * 40}]
    codes: Counter[grpc.StatusCode] = Counter()

    async def pod(i: int) -> None:
        request = publish_request(record, rig.target(pod=f"pod-{i}"), volume_id=f"csi-{i}")
        for _ in range(12):
            code, _ = await code_of(plugin.socket, request)
            codes[code] += 1

    async with rig.running() as plugin:
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(pod, i)
        ready = plugin.volumes.ready

    assert ready
    assert set(codes) <= {grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION}
    assert codes[grpc.StatusCode.FAILED_PRECONDITION] > 0


async def _burst(rig: Rig, socket: Path, record: ArtifactRecord, n: int, round_: int) -> None:
    """``n`` pods of one model published at once, then unpublished at once."""
    clients = anyio.CapacityLimiter(n)
    names = [(f"csi-{round_}-{i}", rig.target(pod=f"pod-{round_}-{i}")) for i in range(n)]

    async def publish(volume_id: str, target: Path) -> None:
        request = publish_request(record, target, volume_id=volume_id)
        await publish_once(socket, request, limiter=clients)

    async with anyio.create_task_group() as tg:
        for volume_id, target in names:
            tg.start_soon(publish, volume_id, target)
    async with anyio.create_task_group() as tg:
        for volume_id, target in names:
            tg.start_soon(partial(unpublish_once, limiter=clients), socket, volume_id, target)


def _mounts_under(path: Path) -> list[str]:
    return [m.mount_point for m in mounting.read_mountinfo() if m.mount_point.startswith(str(path))]


@pytest.mark.usefixtures("mounts")
async def test_concurrent_publishes_of_one_model_all_succeed_and_leave_nothing(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)

    try:
        async with rig.running() as plugin:
            await publish_until_done(plugin.socket, publish_request(record, rig.target()))
            await unpublish_once(plugin.socket, "csi-abc", rig.target())
            for round_ in range(3):
                await _burst(rig, plugin.socket, record, 30, round_)
            refs = dict(plugin.volumes.refs)
        left = _mounts_under(rig.settings.pods_dir)
    finally:
        for target in _mounts_under(rig.settings.pods_dir):  # never leak a mount into the host
            mounting.unmount(Path(target))

    ledger = rig.settings.cache_root / "ledger"
    assert refs == {}
    assert [p.name for p in ledger.rglob("*") if p.name.endswith(".tmp")] == []
    assert left == []

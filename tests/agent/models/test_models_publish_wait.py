"""NodePublishVolume holds kubelet's call while the model downloads (issue 19).

A real grpcio client with a deadline against the plugin and a local fake Hub whose file
responses wait on a gate the test opens: nothing here depends on how fast anything runs, only
on the order of events (the window a call gets is its deadline less the margin).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc
import msgspec
import pytest
from models_harness import (
    FILES,
    TUNING,
    Rig,
    publish,
    publish_request,
    settled,
    unpublish,
)

from agent.models import mounting, running
from agent.models.jobs import Pod, fraction
from agent.models.tuning import Tuning
from agent.models.volumes import wait_window
from bus import testing as bus_testing
from proto.csi import v1 as csi

pytestmark = pytest.mark.anyio

METHOD = "/csi.v1.Node/NodePublishVolume"
STILL = re.compile(r"^model sha256:[0-9a-f]{12} still downloading: \d+ % \([\d.]+ of [\d.]+ MiB\)$")


def test_the_window_is_the_deadline_less_the_margin_capped() -> None:
    tuning = Tuning(publish_wait_s=100.0, publish_margin_s=5.0)

    assert wait_window(None, tuning) == 100.0
    assert wait_window(120.0, tuning) == 100.0
    assert wait_window(30.0, tuning) == 25.0
    assert wait_window(3.0, tuning) == 0.0


def test_progress_reads_as_a_percentage_of_the_size() -> None:
    gib = 1024**3
    assert fraction(int(3.2 * gib), int(7.8 * gib)) == "41 % (3.2 of 7.8 GiB)"
    assert fraction(0, 3 * 1024 * 1024) == "0 % (0.0 of 3.0 MiB)"
    assert fraction(10, 100) == "10 % (10 of 100 B)"
    assert fraction(0, 0) == "100 % (0 B)"


def _waiting(rig: Rig, **tuning: Any) -> None:
    """Give ``rig`` a publish window; its file responses wait for ``rig.hub.gate``."""
    rig.settings = msgspec.structs.replace(
        rig.settings, tuning=msgspec.structs.replace(TUNING, **tuning)
    )
    rig.hub.gate = anyio.Event()


@contextmanager
def _call(
    socket: Path, request: csi.NodePublishVolumeRequest, timeout: float | None = None
) -> Iterator[grpc.Future]:
    """A NodePublishVolume in flight (grpcio's future), its channel closed on leaving."""
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        call = channel.unary_unary(
            METHOD,
            request_serializer=bytes,
            response_deserializer=csi.NodePublishVolumeResponse.FromString,
        )
        yield call.future(request, timeout=timeout)


async def _outcome(future: grpc.Future) -> tuple[grpc.StatusCode, str]:
    def result() -> tuple[grpc.StatusCode, str]:
        try:
            future.result()
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
        return grpc.StatusCode.OK, ""

    return await anyio.to_thread.run_sync(result)


async def _until(check: Any) -> None:
    async def ok() -> bool:
        return bool(check())

    await bus_testing.eventually(ok, timeout_s=30.0)


def _job_of(plugin: running.Plugin, digest: str | None) -> Any:
    return plugin.materializer.jobs.get((digest or "")[7:])


@pytest.mark.usefixtures("mounts")
async def test_a_download_that_ends_within_the_call_mounts_in_it(rig: Rig) -> None:
    _waiting(rig, publish_wait_s=120.0, publish_margin_s=5.0)
    record = rig.artifact("org/model", FILES)
    target = rig.target()

    async with rig.running() as plugin:
        with _call(plugin.socket, publish_request(record, target), timeout=60.0) as future:
            await _until(lambda: getattr(_job_of(plugin, record.manifest_digest), "waiters", 0))
            assert not future.done()  # held open while the download is blocked
            rig.hub.gate.set()
            code, message = await _outcome(future)
        mounted = mounting.is_mount_point(target)
        data = (target / "config.json").read_bytes()
        await unpublish(plugin.socket, "csi-abc", target)
        counted = plugin.metrics.mounts.labels(result="materialized")._value.get()

    assert (code, message) == (grpc.StatusCode.OK, "")
    assert mounted is not None and mounted.read_only
    assert data == FILES["config.json"]
    assert counted == 1


@pytest.mark.usefixtures("mounts")
async def test_past_the_deadline_it_answers_aborted_still_downloading(rig: Rig) -> None:
    # Window: 8 s deadline less a 6 s margin. The margin leaves the answer time to arrive.
    _waiting(rig, publish_wait_s=120.0, publish_margin_s=6.0)
    record = rig.artifact("org/model", FILES)
    first, second = rig.target(pod="pod-1"), rig.target(pod="pod-2")
    digest = record.manifest_digest

    async with rig.running() as plugin:
        # pod-1 starts the download and holds its call (no deadline: the cap applies)...
        with _call(plugin.socket, publish_request(record, first)) as holding:
            await _until(lambda: getattr(_job_of(plugin, digest), "phase", "") == "downloading")
            # ...pod-2's call, with a deadline, cannot outlast the blocked download.
            request = publish_request(record, second, volume_id="csi-2", **{
                "csi.storage.k8s.io/pod.name": "pod-2",
                "csi.storage.k8s.io/pod.uid": "uid-2",
            })  # fmt: skip
            with _call(plugin.socket, request, timeout=8.0) as bounded:
                code, message = await _outcome(bounded)
            still_running = _job_of(plugin, digest) is not None
            waiters_after = _job_of(plugin, digest).waiters
            pods = [p.name for p in _job_of(plugin, digest).waiting(1e18, 1e18)]
            assert not holding.done()
            rig.hub.gate.set()
            held = await _outcome(holding)
        await publish(plugin.socket, request)  # published now: mounts at once
        await unpublish(plugin.socket, "csi-abc", first)
        await unpublish(plugin.socket, "csi-2", second)

    assert code == grpc.StatusCode.ABORTED
    assert STILL.match(message), message
    assert still_running and waiters_after == 1  # pod-1 still waits; pod-2's waiter is gone
    assert pods == ["pod-1", "pod-2"]
    assert held == (grpc.StatusCode.OK, "")
    assert len([s for s in rig.hub.seen if s.path.endswith("/config.json")]) == 1


@pytest.mark.usefixtures("mounts")
async def test_a_caller_giving_up_does_not_cancel_the_download(rig: Rig) -> None:
    _waiting(rig, publish_wait_s=120.0, publish_margin_s=5.0)
    record = rig.artifact("org/model", FILES)
    target = rig.target()
    digest = record.manifest_digest

    async with rig.running() as plugin:
        with _call(plugin.socket, publish_request(record, target)) as future:
            await _until(lambda: getattr(_job_of(plugin, digest), "waiters", 0) == 1)
            future.cancel()  # kubelet gave up: the stream is reset
        await _until(lambda: _job_of(plugin, digest).waiters == 0)
        job = _job_of(plugin, digest)
        cancelled = job.scope.cancel_called
        locks = dict(plugin.volumes._locks)
        rig.hub.gate.set()
        await settled(plugin)
        published = plugin.cache.is_published((digest or "")[7:])
        await publish(plugin.socket, publish_request(record, target))  # mounts at once
        await unpublish(plugin.socket, "csi-abc", target)

    assert not cancelled
    assert locks == {}
    assert published
    assert len([s for s in rig.hub.seen if s.path.endswith("/config.json")]) == 1


@pytest.mark.usefixtures("mounts")
async def test_concurrent_calls_wait_on_one_download(rig: Rig) -> None:
    _waiting(rig, publish_wait_s=120.0, publish_margin_s=5.0)
    record = rig.artifact("org/model", FILES)
    targets = [rig.target(pod=f"pod-{i}") for i in range(5)]
    digest = record.manifest_digest

    def request(i: int) -> csi.NodePublishVolumeRequest:
        return publish_request(record, targets[i], volume_id=f"csi-{i}", **{
            "csi.storage.k8s.io/pod.name": f"pod-{i}",
            "csi.storage.k8s.io/pod.uid": f"uid-{i}",
        })  # fmt: skip

    async with rig.running() as plugin:
        with (
            _call(plugin.socket, request(0), timeout=60) as f0,
            _call(plugin.socket, request(1), timeout=60) as f1,
            _call(plugin.socket, request(2), timeout=60) as f2,
            _call(plugin.socket, request(3), timeout=60) as f3,
            _call(plugin.socket, request(4), timeout=60) as f4,
        ):
            await _until(lambda: getattr(_job_of(plugin, digest), "waiters", 0) == 5)
            jobs = len(plugin.materializer.jobs)
            pods = _job_of(plugin, digest).waiting(0.0, 1e18)
            rig.hub.gate.set()
            outcomes = [await _outcome(f) for f in (f0, f1, f2, f3, f4)]
        referenced = plugin.volumes.reference_counts()
        for i in range(5):
            await unpublish(plugin.socket, f"csi-{i}", targets[i])

    assert outcomes == [(grpc.StatusCode.OK, "")] * 5
    assert jobs == 1
    assert pods == [Pod("team-a", f"pod-{i}", f"uid-{i}") for i in range(5)]
    assert referenced == {(digest or "")[7:]: 5}
    assert len([s for s in rig.hub.seen if s.path.endswith("/config.json")]) == 1


async def test_a_failed_download_answers_its_error_at_once(rig: Rig) -> None:
    _waiting(rig, publish_wait_s=120.0, publish_margin_s=5.0)
    rig.hub.gate.set()
    rig.hub.corrupt.add("model-00002.safetensors")
    record = rig.artifact("org/model", FILES)

    async with rig.running() as plugin:
        # Within its 115 s window, the call ends with the attempt's failure, not ABORTED.
        with _call(plugin.socket, publish_request(record, rig.target()), timeout=120) as f:
            code, message = await _outcome(f)
        jobs = dict(plugin.materializer.jobs)

    assert code == grpc.StatusCode.UNAVAILABLE
    assert "IntegrityMismatch" in message and "still downloading" not in message
    assert jobs == {}


@pytest.mark.usefixtures("mounts")
async def test_a_held_call_keeps_the_download_asked_for(rig: Rig) -> None:
    # An attempt unasked for 0.05 s is cancelled; the check runs every 0.0125 s.
    _waiting(rig, publish_wait_s=120.0, publish_margin_s=5.0, waiter_window_s=0.05)
    record = rig.artifact("org/model", FILES)
    digest = record.manifest_digest

    async with rig.running() as plugin:
        with _call(plugin.socket, publish_request(record, rig.target())) as future:
            await _until(lambda: getattr(_job_of(plugin, digest), "waiters", 0) == 1)
            job = _job_of(plugin, digest)
            await anyio.sleep(0.5)  # forty checks: none may cancel a job someone waits in
            kept = not job.scope.cancel_called
            future.cancel()
        await _until(lambda: _job_of(plugin, digest) is None)  # unasked now: cancelled
        rig.hub.gate.set()  # the Hub's held responses end

    assert kept
    assert job.scope.cancel_called

"""Downloading one file: segments, resume after a cut connection or a restart, verification."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import grpc
import msgspec
import pytest
from models_harness import FILES, TUNING, Rig, code_of, content, publish_request, settled

from agent.models import downloading
from agent.models.errors import NoSpace
from bus import testing as bus_testing
from hub import client as hub_client
from hub import testing
from hub.errors import IntegrityMismatch
from hub.manifest import Entry

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

BIG = content(3 * 1024 * 1024 + 5, 7)
ENTRY = Entry("sha256", hashlib.sha256(BIG).hexdigest(), len(BIG), "big.bin")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[testing.FakeHub, downloading.Origin]]:
    fake = testing.FakeHub(tmp_path / "hub")
    commit = fake.add("org/m", {"big.bin": BIG})
    async with (
        testing.serving(fake) as endpoints,
        hub_client.client(hub_client.HubSettings(endpoint=endpoints.hub)) as hub,
    ):
        yield fake, downloading.Origin(hub, "org/m", commit, None)


async def _fetch(origin: downloading.Origin, tmp: Path, moved: list[int], **limits: int) -> None:
    await downloading.fetch(
        origin,
        ENTRY,
        tmp / "tree" / "big.bin",
        tmp / "state",
        limits=downloading.Limits(limits.get("concurrency", 8), limits.get("rate", 0)),
        tuning=TUNING,
        progress=moved.append,
    )


async def test_large_file_arrives_in_ranged_segments(
    served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = served
    moved: list[int] = []

    await _fetch(origin, tmp_path, moved)

    assert (tmp_path / "tree" / "big.bin").read_bytes() == BIG
    ranges = sorted(s.range for s in fake.seen if s.path.startswith("/blobs/") and s.range)
    assert len(ranges) == 13  # 3 MiB + 5 bytes in 256 KiB segments
    assert sum(moved) == len(BIG)


async def test_a_large_file_is_flushed_behind_its_writes_not_only_at_the_end(
    served: tuple[testing.FakeHub, downloading.Origin],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sync-behind flushes after every ``sync_behind_bytes`` written (512 KiB here), while
    later segments still arrive: the real ``fdatasync`` runs, counted on the way."""
    _, origin = served
    flushed: list[int] = []
    moved: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        flushed.append(sum(moved))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    await _fetch(origin, tmp_path, moved)

    assert (tmp_path / "tree" / "big.bin").read_bytes() == BIG
    assert flushed, "no flush ran while the file downloaded"
    assert min(flushed) < len(BIG)  # the first flush came before the last byte


async def test_a_download_cancelled_mid_file_leaves_no_descriptor_open(
    served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    """Cancelled while segments stream (rate-limited to 1 MiB/s, so it is mid-file) and the
    flush behind them runs: every descriptor it opened is closed, and the resume state saved."""
    _, origin = served
    moved: list[int] = []

    with anyio.move_on_after(0.6):
        await _fetch(origin, tmp_path, moved, rate=1024 * 1024)

    assert 0 < sum(moved) < len(BIG)
    assert _files_open_under(tmp_path / "tree") == []
    assert (tmp_path / "state").exists()


def _files_open_under(root: Path) -> list[str]:
    """This process's descriptors on files under ``root`` (sockets and pipes are not)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:
            continue  # the descriptor listdir itself used
    return [t for t in targets if t.startswith(str(root))]


async def test_a_connection_cut_mid_file_resumes_from_the_last_byte(
    served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = served
    fake.break_once["big.bin"] = 100_000  # the first response stops after 100 000 bytes

    await _fetch(origin, tmp_path, [])

    assert (tmp_path / "tree" / "big.bin").read_bytes() == BIG
    asked = [s.range for s in fake.seen if s.path.startswith("/blobs/") and s.range]
    # Whichever segment's response came first was cut (segments run four at a time): it was
    # asked once whole, then once more from what it had written: the last byte the cut
    # response delivered when the client read it before the close (a partial batch is
    # written too), the last full batch (64 KiB), or its own start when the close was seen
    # before any batch was read (the client drops what it buffered once a read fails).
    starts = [int(r.removeprefix("bytes=").split("-")[0]) for r in asked]
    segments = [start - start % 262_144 for start in starts]
    twice = [seg for seg in set(segments) if segments.count(seg) == 2]
    assert len(twice) == 1 and len(asked) == 14, asked  # 13 segments, one asked again
    resumed = max(start for start in starts if start - start % 262_144 == twice[0])
    assert resumed % 262_144 in (0, 65_536, 100_000), asked


async def test_a_restart_resumes_what_was_written(
    served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = served
    moved: list[int] = []

    with anyio.CancelScope() as scope:

        def count(n: int) -> None:
            moved.append(n)
            if sum(moved) > len(BIG) // 2:
                scope.cancel()

        await downloading.fetch(
            origin,
            ENTRY,
            tmp_path / "tree" / "big.bin",
            tmp_path / "state",
            limits=downloading.Limits(2, 0),
            tuning=TUNING,
            progress=count,
        )
    first = sum(moved)
    fake.seen.clear()
    again: list[int] = []
    await _fetch(origin, tmp_path, again)

    assert scope.cancelled_caught
    assert (tmp_path / "tree" / "big.bin").read_bytes() == BIG
    assert 0 < sum(again) < len(BIG)  # only what was missing came again
    # No exact sum with what the first run reported: bytes are written in batches and the
    # report follows the write, so a cancel between them leaves written bytes unreported.
    assert first > 0
    assert not [s for s in fake.seen if s.range == "bytes=0-262143"]


async def test_a_server_without_ranges_still_gives_a_verified_file(
    served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = served
    fake.ranges = False

    await _fetch(origin, tmp_path, [], rate=64 * 1024 * 1024)

    assert (tmp_path / "tree" / "big.bin").read_bytes() == BIG


async def test_corrupt_bytes_delete_the_file_and_its_state(
    served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = served
    fake.corrupt.add("big.bin")

    with pytest.raises(IntegrityMismatch):
        await _fetch(origin, tmp_path, [])

    assert not (tmp_path / "tree" / "big.bin").exists()
    assert not (tmp_path / "state").exists()


def _tmpfs(path: Path, size: str) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    path.mkdir(parents=True)
    return libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, f"size={size}".encode()) == 0


def _umount(path: Path) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.umount2(os.fsencode(path), 2)


async def test_a_full_disk_is_no_space_before_any_byte(
    served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    _, origin = served
    small = tmp_path / "small"
    if not _tmpfs(small, "1m"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(NoSpace):
            await _fetch(origin, small, [])
    finally:
        _umount(small)


async def test_a_full_cache_answers_resource_exhausted_and_publishes_nothing(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    root = rig.settings.cache_root
    if not _tmpfs(root, "2m"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        async with rig.running() as plugin:
            first, _ = await code_of(plugin.socket, publish_request(record, rig.target()))
            await settled(plugin)
            code, message = await code_of(plugin.socket, publish_request(record, rig.target()))
            published = list((root / "published").iterdir())
    finally:
        _umount(root)

    assert first == grpc.StatusCode.ABORTED
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "InsufficientCapacity" in message
    assert published == []


SMALL = content(200 * 1024 + 3, 9)
SMALL_ENTRY = Entry("sha256", hashlib.sha256(SMALL).hexdigest(), len(SMALL), "small.bin")


@pytest.fixture
async def small_served(
    tmp_path: Path,
) -> AsyncIterator[tuple[testing.FakeHub, downloading.Origin]]:
    fake = testing.FakeHub(tmp_path / "hub")
    commit = fake.add("org/s", {"small.bin": SMALL})
    async with (
        testing.serving(fake) as endpoints,
        hub_client.client(hub_client.HubSettings(endpoint=endpoints.hub)) as hub,
    ):
        yield fake, downloading.Origin(hub, "org/s", commit, None)


async def _fetch_small(origin: downloading.Origin, tmp: Path, moved: list[int]) -> None:
    await downloading.fetch(
        origin,
        SMALL_ENTRY,
        tmp / "tree" / "small.bin",
        tmp / "state" / "small",
        limits=downloading.Limits(8, 0),
        tuning=TUNING,
        progress=moved.append,
    )


def _blob_requests(fake: testing.FakeHub) -> list[str | None]:
    return [s.range for s in fake.seen if s.path.startswith("/blobs/")]


async def test_a_small_file_is_one_plain_request_and_leaves_no_resume_state(
    small_served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = small_served
    moved: list[int] = []

    await _fetch_small(origin, tmp_path, moved)

    assert (tmp_path / "tree" / "small.bin").read_bytes() == SMALL
    assert stat.S_IMODE((tmp_path / "tree" / "small.bin").stat().st_mode) == 0o444  # as landed
    assert _blob_requests(fake) == [None]  # whole, not in 64 KiB-chunk ranges
    assert sum(moved) == len(SMALL)
    assert not (tmp_path / "state").exists()


async def test_a_small_file_cut_mid_body_is_asked_again_whole(
    small_served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = small_served
    fake.break_once["small.bin"] = 70_000

    await _fetch_small(origin, tmp_path, [])

    assert (tmp_path / "tree" / "small.bin").read_bytes() == SMALL
    assert _blob_requests(fake) == [None, None]


async def test_a_small_file_already_there_is_rehashed_not_fetched_and_a_torn_one_is_fetched(
    small_served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = small_served
    dest = tmp_path / "tree" / "small.bin"
    await _fetch_small(origin, tmp_path, [])
    fake.seen.clear()

    await _fetch_small(origin, tmp_path, [])  # an attempt resumed after it was written
    kept = _blob_requests(fake)
    dest.unlink()
    dest.write_bytes(b"\0" * len(SMALL))  # a torn file, writable (an older build's landing)
    await _fetch_small(origin, tmp_path, [])

    assert kept == []
    assert dest.read_bytes() == SMALL
    assert stat.S_IMODE(dest.stat().st_mode) == 0o444  # replaced, not rewritten in place
    assert _blob_requests(fake) == [None]


async def test_corrupt_bytes_of_a_small_file_leave_no_file(
    small_served: tuple[testing.FakeHub, downloading.Origin], tmp_path: Path
) -> None:
    fake, origin = small_served
    fake.corrupt.add("small.bin")

    with pytest.raises(IntegrityMismatch):
        await _fetch_small(origin, tmp_path, [])

    assert not (tmp_path / "tree" / "small.bin").exists()


async def test_a_small_file_waits_to_retry_without_holding_a_request_slot(tmp_path: Path) -> None:
    """The one request slot (``Limits(1, ...)``) is given back when a small file's response is
    cut, before the retry's wait: another file may use it meanwhile; the retry then takes it
    again and the file lands whole."""
    small = content(40 * 1024, 3)
    entry = Entry("sha256", hashlib.sha256(small).hexdigest(), len(small), "small.bin")
    fake = testing.FakeHub(tmp_path / "hub")
    commit = fake.add("org/s", {"small.bin": small})
    fake.break_once["small.bin"] = 1000
    limits = downloading.Limits(1, 0)
    done = anyio.Event()
    async with (
        testing.serving(fake) as endpoints,
        hub_client.client(hub_client.HubSettings(endpoint=endpoints.hub)) as hub,
        anyio.create_task_group() as tg,
    ):

        async def fetch() -> None:
            await downloading.fetch(
                downloading.Origin(hub, "org/s", commit, None),
                entry,
                tmp_path / "tree" / "small.bin",
                tmp_path / "state",
                limits=limits,
                tuning=msgspec.structs.replace(TUNING, retry_delay_s=1.0),
                progress=lambda _: None,
                present=False,
            )
            done.set()

        async def waiting_to_retry() -> bool:  # the cut was served and no slot is held
            return "small.bin" not in fake.break_once and not limits.requests.borrowed_tokens

        tg.start_soon(fetch)
        await bus_testing.eventually(waiting_to_retry, interval_s=0.005)
        # the slot is free while the retry waits: no second request for the file yet
        assert sum(seen.path.endswith("/small.bin") for seen in fake.seen) == 1  # one resolve
        assert not done.is_set()
        limits.requests.acquire_nowait()  # another file's request takes it meanwhile
        limits.requests.release()
        with anyio.fail_after(10):
            await done.wait()
    assert (tmp_path / "tree" / "small.bin").read_bytes() == small

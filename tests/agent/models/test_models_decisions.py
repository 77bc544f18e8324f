"""The pure parts: collection plans, backoff, status snapshots, mountinfo, request shapes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agent.models import collecting, layout, mounting, reporting, volumes
from agent.models.backoff import backoff_delay
from agent.models.errors import CacheCorrupt, InvalidVolume
from agent.models.jobs import Job, Source, human
from bus.records import StoreSpec, Watermarks

H = [c * 64 for c in "abcdef"]


def _c(i: int, size: int, last_used: float, partial: bool = False) -> collecting.Candidate:
    return collecting.Candidate(H[i], size, last_used, partial)


def test_nothing_is_collected_within_the_high_watermark() -> None:
    plan = collecting.plan(
        [_c(0, 10, 0)], used=80, total=100, spec=StoreSpec(), busy=set(), now=1e6, idle_s=600
    )
    assert plan == []


def test_collection_removes_oldest_first_down_to_the_low_watermark() -> None:
    candidates = [_c(0, 5, 300), _c(1, 5, 100), _c(2, 5, 200), _c(3, 5, 50)]

    plan = collecting.plan(
        candidates, used=85, total=100, spec=StoreSpec(), busy={H[3]}, now=1e6, idle_s=600
    )

    assert [c.hex for c in plan] == [H[1], H[2], H[0]]  # H[3] is busy; 85 -> 70


def test_recently_used_trees_are_kept_but_partials_are_not() -> None:
    candidates = [_c(0, 10, 999_900), _c(1, 10, 999_950, partial=True)]

    plan = collecting.plan(
        candidates, used=90, total=100, spec=StoreSpec(), busy=set(), now=1e6, idle_s=600
    )

    assert [c.hex for c in plan] == [H[1]]


def test_a_reservation_counts_as_usage() -> None:
    spec = StoreSpec(watermarks=Watermarks(high_percent=80, low_percent=50))
    plan = collecting.plan(
        [_c(0, 30, 0)], used=60, total=100, spec=spec, busy=set(), now=1e6, idle_s=0, needed=25
    )
    assert [c.hex for c in plan] == [H[0]]


@pytest.mark.parametrize(
    ("failures", "delay"), [(0, 0), (1, 60), (2, 120), (3, 240), (7, 3600), (100, 3600)]
)
def test_backoff_starts_at_a_minute_and_doubles_to_an_hour(failures: int, delay: float) -> None:
    assert backoff_delay(failures, first_s=60, max_s=3600) == delay


def test_human_sizes() -> None:
    assert human(512) == "512 B"
    assert human(3 * 1024**3) == "3.00 GiB"


@pytest.mark.anyio  # a Job holds an event and a cancel scope
async def test_a_job_counts_bytes_by_origin_within_its_size_and_says_peer_past_half() -> None:
    job = Job("a" * 64, [Source("org/m", "c" * 40, None)], started=0, asked=0, size=100)
    job.received(50, "hub")
    job.received(50, "peer")
    assert (job.done, job.hub_bytes, job.peer_bytes, job.source) == (100, 50, 50, "Hub")
    job.received(10, "peer")  # a retried chunk: counted by origin, never past the size
    assert (job.done, job.peer_bytes, job.source) == (100, 60, "Peer")


def test_store_spec_problems() -> None:
    assert StoreSpec().problems() == []
    bad = StoreSpec(watermarks=Watermarks(high_percent=50, low_percent=60), pinned=("x",))
    assert len(bad.problems()) == 2


def test_snapshot_names_models_by_digest_only() -> None:
    facts = reporting.Facts(
        published={H[0]: 10},
        failures={H[2]: layout.DigestRecord(reason="AccessDenied", message="401")},
        jobs={H[1]: (3, 9)},
    )

    event = reporting.snapshot("node-1", facts)

    assert [(m.model, m.state, m.bytes_done, m.bytes_total) for m in event.models] == [
        ("sha256:" + H[0], "ready", None, 10),
        ("sha256:" + H[1], "downloading", 3, 9),
        ("sha256:" + H[2], "failed", None, None),
    ]
    assert event.models[2].message == "AccessDenied: 401"


MOUNTINFO = (
    "22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "90 22 253:0 /var/cache/published/" + H[0] + "/tree /var/lib/kubelet/pods/u/volumes/"
    "kubernetes.io~csi/m/mount ro,nosuid,nodev,relatime shared:1 - ext4 /dev/vda rw\n"
    "91 22 0:50 / /with\\040space rw - tmpfs tmpfs rw\n"
    "garbage\n"
)


def test_mountinfo_parsing() -> None:
    mounts = mounting.parse_mountinfo(MOUNTINFO)

    assert [m.mount_point for m in mounts][1:] == [
        "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/m/mount",
        "/with space",
    ]
    assert mounts[1].read_only and not mounts[0].read_only
    assert mounts[1].root.endswith(H[0] + "/tree")
    assert mounting.is_mount_point(Path("/with space"), mounts) is mounts[2]


def test_kubelet_volume_id_formula() -> None:
    pods = Path("/var/lib/kubelet/pods")
    target = pods / "uid-1" / "volumes" / "kubernetes.io~csi" / "vol" / "mount"

    assert volumes.kubelet_volume_id(target, pods) == (
        "csi-" + hashlib.sha256(b"uid-1vol").hexdigest()
    )
    assert volumes.kubelet_volume_id(pods / "x" / "y", pods) is None


def test_validate_refuses_targets_outside_pods(tmp_path: Path) -> None:
    req = volumes.PublishRequest("v", "/var/lib/kubelet/podsX/a/mount", {}, {}, True)
    with pytest.raises(InvalidVolume, match="not under"):
        volumes.validate(req, Path("/var/lib/kubelet/pods"))


def test_cache_refuses_another_layout(tmp_path: Path) -> None:
    (tmp_path / "layout").write_text("gpustack-model-store v9\n")
    with pytest.raises(CacheCorrupt):
        layout.Cache.open(tmp_path)


def test_cache_refuses_a_foreign_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "important.txt").write_text("x")
    with pytest.raises(CacheCorrupt):
        layout.Cache.open(tmp_path)


def test_cache_created_by_a_pull_killed_before_its_layout_rename_opens(tmp_path: Path) -> None:
    # found by the crash test: killed between mkstemp and rename, the root held only the
    # temporary layout file, and every later pull refused the root as foreign
    (tmp_path / ".layout.k2v9x1.tmp").write_bytes(b"gpustack-mo")
    cache = layout.Cache.open(tmp_path)
    assert (tmp_path / "layout").read_text().strip() == layout.LAYOUT
    assert not list(tmp_path.glob(".layout.*"))
    assert cache.published.is_dir()
    other = tmp_path / "other"
    (other / ".layout.k2v9x1.tmp").mkdir(parents=True)  # only a file of that name is ours
    with pytest.raises(CacheCorrupt):
        layout.Cache.open(other)


def test_cache_opens_twice_and_empties_trash(tmp_path: Path) -> None:
    cache = layout.Cache.open(tmp_path)
    (cache.trash / "old").mkdir()
    layout.Cache.open(tmp_path)
    assert list(cache.trash.iterdir()) == []
    assert (tmp_path / "layout").read_text() == "gpustack-model-store v1\n"

"""CSI targets must really lie under ``<kubelet>/pods``: grpcio client -> our grpclib server ->
real bind mounts, with symlinks, NUL bytes and a kubelet directory that is itself a link."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import grpc
import msgspec
import pytest
from models_harness import (
    FILES,
    Rig,
    call,
    code_of,
    publish_request,
    publish_until_done,
)

from agent.models import mounting
from proto.csi import v1 as csi

pytestmark = pytest.mark.anyio

_VOLUME = Path("volumes/kubernetes.io~csi/model")


def _mounts_under(path: Path) -> list[str]:
    real = os.path.realpath(path)
    return [m.mount_point for m in mounting.read_mountinfo() if m.mount_point.startswith(real)]


@contextmanager
def _no_mount_left(*paths: Path) -> Iterator[None]:
    """Whatever a failing run mounted under ``paths`` is detached, so no test leaks a mount."""
    try:
        yield
    finally:
        for path in paths:
            for point in reversed(_mounts_under(path)):
                mounting.unmount(Path(point))


async def _publish_like_kubelet(
    socket: Path, request: csi.NodePublishVolumeRequest
) -> tuple[grpc.StatusCode, str]:
    """Retry while ABORTED (the model downloading), as kubelet does; the final answer."""
    for _ in range(400):
        code, message = await code_of(socket, request)
        if code != grpc.StatusCode.ABORTED:
            return code, message
        await anyio.sleep(0.02)
    raise AssertionError("still materializing after 400 tries")


async def _unpublish(socket: Path, volume_id: str, target: str) -> tuple[grpc.StatusCode, str]:
    try:
        await call(
            socket,
            "/csi.v1.Node/NodeUnpublishVolume",
            csi.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target),
            csi.NodeUnpublishVolumeResponse.FromString,
        )
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def _symlinked(rig: Rig, where: str) -> tuple[Path, Path]:
    """A target under ``<pods>/evil`` that a symlink leads to ``<tmp>/outside``: the pod
    directory itself (``pod``) or the target's last component (``mount``)."""
    pods, outside = rig.settings.pods_dir, rig.tmp / "outside"
    (outside / _VOLUME).mkdir(parents=True)
    (outside / "mount").mkdir()
    pods.mkdir(parents=True)
    target = pods / "evil" / _VOLUME / "mount"
    if where == "pod":
        (pods / "evil").symlink_to(outside)
    else:
        target.parent.mkdir(parents=True)
        target.symlink_to(outside / "mount")
    return target, outside


@pytest.mark.usefixtures("mounts")
@pytest.mark.parametrize("where", ["pod", "mount"])
async def test_a_target_reached_through_a_symlink_is_refused_and_nothing_leaves_pods(
    rig: Rig, where: str
) -> None:
    record = rig.artifact("org/model", FILES)
    target, outside = _symlinked(rig, where)
    before = sorted(str(p.relative_to(outside)) for p in outside.rglob("*"))

    with _no_mount_left(outside, rig.settings.pods_dir):
        async with rig.running() as plugin:
            code, message = await _publish_like_kubelet(
                plugin.socket, publish_request(record, target)
            )
            mounted = _mounts_under(outside)
            undone = await _unpublish(plugin.socket, "csi-abc", str(target))

    assert (code, mounted) == (grpc.StatusCode.INVALID_ARGUMENT, [])
    assert "symlink" in message
    assert undone[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == before


@pytest.mark.usefixtures("mounts")
async def test_unpublish_through_a_symlink_leaves_the_mount_it_leads_to(rig: Rig) -> None:
    """Someone else's mount outside the pods directory is never unmounted nor removed."""
    target, outside = _symlinked(rig, "pod")
    source = rig.tmp / "source"
    source.mkdir()
    (outside / _VOLUME / "mount").mkdir()
    with _no_mount_left(outside):
        mounting.bind_read_only(source, outside / _VOLUME / "mount")
        async with rig.running() as plugin:
            undone = await _unpublish(plugin.socket, "csi-abc", str(target))
        still = _mounts_under(outside)

    assert undone[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert still == [str(outside / _VOLUME / "mount")]


@pytest.mark.parametrize(
    "target",
    [
        "{pods}/pod-1/volumes/kubernetes.io~csi/model/mo\0unt",
        "{pods}/pod-1/volumes/kubernetes.io~csi/model/\0",
        "{pods}/pod-1/volumes/kubernetes.io~csi/" + "m" * 5000 + "/mount",
        "{pods}/pod-1/volumes/kubernetes.io~csi/" + "m" * 300 + "/mount",  # a name over 255
    ],
    ids=["nul", "nul-only", "over-path-max", "over-name-max"],
)
async def test_invalid_paths_are_invalid_argument_on_publish_and_unpublish(
    rig: Rig, target: str
) -> None:
    record = rig.artifact("org/model", FILES)
    rig.target()
    raw = target.format(pods=rig.settings.pods_dir)
    request = publish_request(record, rig.target())
    request.target_path = raw

    async with rig.running() as plugin:
        published = await code_of(plugin.socket, request)
        undone = await _unpublish(plugin.socket, "csi-abc", raw)

    assert published[0] == grpc.StatusCode.INVALID_ARGUMENT, published
    assert undone[0] == grpc.StatusCode.INVALID_ARGUMENT, undone
    assert "\n" not in published[1] and len(published[1]) < 600


@pytest.mark.usefixtures("mounts")
async def test_unpublish_cleans_up_when_the_kubelet_directory_is_a_link(rig: Rig) -> None:
    """``/var/lib/kubelet -> /data/kubelet`` is common: mountinfo names the real path, the
    target the linked one; publish, republish, a restart and unpublish still agree."""
    real = rig.tmp / "data-kubelet"
    real.mkdir()
    link = rig.tmp / "kubelet-link"
    link.symlink_to(real)
    rig.settings = msgspec.structs.replace(rig.settings, kubelet_dir=link)
    record = rig.artifact("org/model", FILES)
    target = rig.target(pod="uid-1")

    with _no_mount_left(real):
        async with rig.running() as plugin:
            await publish_until_done(plugin.socket, publish_request(record, target))
            await publish_until_done(plugin.socket, publish_request(record, target))  # idempotent
            stacked = _mounts_under(real)
        async with rig.running() as plugin:  # a restart: references rebuilt from mountinfo
            refs = sorted(r.target_path for r in plugin.volumes.refs.values())
            undone = await _unpublish(plugin.socket, "csi-abc", str(target))
            left = _mounts_under(real)

    assert len(stacked) == 1
    assert refs == [str(target)]
    assert undone[0] == grpc.StatusCode.OK, undone
    assert left == []
    assert not target.exists() and target.parent.is_dir()

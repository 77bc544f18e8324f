"""The CSI node plugin end to end: grpcio client -> grpclib server -> fake Hub -> bind mount."""

from __future__ import annotations

import errno
import os

import anyio
import grpc
import msgspec
import pytest
from models_harness import (
    FILES,
    Rig,
    call,
    code_of,
    publish,
    publish_request,
    publish_until_done,
    settled,
    unpublish,
)

from agent.models import mounting
from bus.records import ArtifactRecord
from proto.csi import v1 as csi

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


async def test_identity_and_node_info(rig: Rig) -> None:
    async with rig.running() as plugin:
        info = await call(
            plugin.socket,
            "/csi.v1.Identity/GetPluginInfo",
            csi.GetPluginInfoRequest(),
            csi.GetPluginInfoResponse.FromString,
        )
        caps = await call(
            plugin.socket,
            "/csi.v1.Identity/GetPluginCapabilities",
            csi.GetPluginCapabilitiesRequest(),
            csi.GetPluginCapabilitiesResponse.FromString,
        )
        probe = await call(
            plugin.socket,
            "/csi.v1.Identity/Probe",
            csi.ProbeRequest(),
            csi.ProbeResponse.FromString,
        )
        node = await call(
            plugin.socket,
            "/csi.v1.Node/NodeGetInfo",
            csi.NodeGetInfoRequest(),
            csi.NodeGetInfoResponse.FromString,
        )
        node_caps = await call(
            plugin.socket,
            "/csi.v1.Node/NodeGetCapabilities",
            csi.NodeGetCapabilitiesRequest(),
            csi.NodeGetCapabilitiesResponse.FromString,
        )

    assert (info.name, info.vendor_version) == ("model.csi.gpustack.ai", "0.1.0")
    assert caps.capabilities == [] and node_caps.capabilities == []
    assert probe.ready is True
    assert node.node_id == "node-1"
    assert not rig.settings.socket_path.exists()


@pytest.mark.usefixtures("mounts")
async def test_publish_materializes_then_mounts_read_only_and_unpublish_cleans(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    target = rig.target()
    request = publish_request(record, target)

    async with rig.running() as plugin:
        progress = await publish_until_done(plugin.socket, request)
        await publish(plugin.socket, request)  # idempotent
        mounted = mounting.is_mount_point(target)
        listing = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
        data = (target / "model-00001.safetensors").read_bytes()
        with pytest.raises(OSError) as caught:
            (target / "new").write_bytes(b"x")
        await unpublish(plugin.socket, "csi-abc", target)
        await unpublish(plugin.socket, "csi-abc", target)  # idempotent
        event = plugin.reporter.last

    assert progress and progress[0].startswith("model sha256:")
    assert all(" still downloading: " in m for m in progress)
    assert mounted is not None and mounted.read_only
    assert listing == sorted(FILES)
    assert data == FILES["model-00001.safetensors"]
    assert caught.value.errno == errno.EROFS
    assert not target.exists()
    assert event is not None
    assert [(m.model, m.state) for m in event.models] == [(record.manifest_digest, "ready")]
    published = rig.settings.cache_root / "published" / (record.manifest_digest or "")[7:]
    assert os.stat(published / "tree" / "config.json").st_mode & 0o777 == 0o444
    assert os.stat(published / "tree").st_mode & 0o777 == 0o555


@pytest.mark.usefixtures("mounts")
async def test_twenty_concurrent_publishes_join_one_download(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    gate = anyio.Event()
    rig.hub.gate = gate
    targets = [rig.target(pod=f"pod-{i}") for i in range(20)]

    async with rig.running() as plugin:
        codes: list[grpc.StatusCode] = []

        async def first(i: int) -> None:
            code, _ = await code_of(
                plugin.socket, publish_request(record, targets[i], volume_id=f"csi-{i}")
            )
            codes.append(code)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(first, i)
        jobs = len(plugin.materializer.jobs)
        gate.set()
        for i in range(20):
            await publish_until_done(
                plugin.socket, publish_request(record, targets[i], volume_id=f"csi-{i}")
            )
        referenced = plugin.volumes.referenced()
        for i in range(20):
            await unpublish(plugin.socket, f"csi-{i}", targets[i])

    assert codes == [grpc.StatusCode.ABORTED] * 20
    assert jobs == 1
    file_gets = [s for s in rig.hub.seen if s.path.endswith("/config.json")]
    assert len(file_gets) == 1
    assert referenced == {(record.manifest_digest or "")[7:]}


async def test_corrupt_bytes_publish_nothing_and_back_off(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    rig.hub.corrupt.add("model-00002.safetensors")
    target = rig.target()

    async with rig.running() as plugin:
        code, _ = await code_of(plugin.socket, publish_request(record, target))
        await settled(plugin)
        code2, message2 = await code_of(plugin.socket, publish_request(record, target))

    assert code == grpc.StatusCode.ABORTED
    assert code2 == grpc.StatusCode.UNAVAILABLE
    assert "IntegrityMismatch" in message2 and "the next attempt starts at" in message2
    assert list((rig.settings.cache_root / "published").iterdir()) == []
    assert not target.exists()


def _other(record: ArtifactRecord, **changes: object) -> ArtifactRecord:
    return msgspec.structs.replace(record, **changes)


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ("missing", "the Pod's namespace has no such ModelArtifact"),
        ("uid", "the ModelArtifact is not the one the volume names"),
        ("unresolved", "the ModelArtifact is not resolved"),
        ("undigested", "the ModelArtifact is not resolved"),
        ("digest", "the ModelArtifact resolves to another digest"),
        ("namespace", "the Pod's namespace has no such ModelArtifact"),
    ],
)
async def test_authorization_failures_name_their_rule(rig: Rig, change: str, rule: str) -> None:
    record = rig.artifact("org/model", FILES)
    request = publish_request(record, rig.target())
    if change == "missing":
        rig.policy.delete(record.namespace, record.name)
    elif change == "uid":
        request.volume_context["artifactUID"] = "another"
    elif change == "unresolved":
        rig.policy.put(_other(record, revision=None))
    elif change == "undigested":
        rig.policy.put(_other(record, manifest_digest=None))
    elif change == "digest":
        rig.policy.put(_other(record, manifest_digest="sha256:" + "0" * 64))
    else:
        request.volume_context["csi.storage.k8s.io/pod.namespace"] = "team-b"

    async with rig.running() as plugin:
        code, message = await code_of(plugin.socket, request)

    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert message.startswith(rule)
    assert rig.hub.seen == [s for s in rig.hub.seen if "/resolve/" not in s.path]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r, rig: setattr(r, "target_path", "/etc/evil/mount"),
        lambda r, rig: setattr(r, "target_path", str(rig.settings.pods_dir / ".." / "x" / "mount")),
        lambda r, rig: setattr(r, "target_path", ""),
        lambda r, rig: setattr(r, "volume_id", ""),
        lambda r, rig: r.volume_context.pop("artifact"),
        lambda r, rig: r.volume_context.update({"csi.storage.k8s.io/ephemeral": "false"}),
        lambda r, rig: r.volume_context.update({"manifestDigest": "sha256:XYZ"}),
        lambda r, rig: setattr(r, "volume_capability", csi.VolumeCapability()),
    ],
)
async def test_bad_requests_are_invalid_argument(rig: Rig, mutate: object) -> None:
    record = rig.artifact("org/model", FILES)
    request = publish_request(record, rig.target())
    mutate(request, rig)  # type: ignore[operator]

    async with rig.running() as plugin:
        code, _ = await code_of(plugin.socket, request)

    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_unsynced_policy_is_unavailable(rig: Rig) -> None:
    from agent.models.policy import MemoryPolicy

    record = rig.artifact("org/model", FILES)
    rig.policy = MemoryPolicy()

    async with rig.running() as plugin:
        code, _ = await code_of(plugin.socket, publish_request(record, rig.target()))

    assert code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.usefixtures("mounts")
async def test_republish_with_other_attributes_is_already_exists(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    other = rig.artifact("org/other", {"a.txt": b"a"}, name="small")
    target = rig.target()

    async with rig.running() as plugin:
        await publish_until_done(plugin.socket, publish_request(record, target))
        code, _ = await code_of(
            plugin.socket, publish_request(other, target, volume_id="csi-other")
        )
        await unpublish(plugin.socket, "csi-abc", target)

    assert code == grpc.StatusCode.ALREADY_EXISTS


@pytest.mark.usefixtures("mounts")
async def test_references_are_rebuilt_from_mountinfo_after_a_restart(rig: Rig) -> None:
    record = rig.artifact("org/model", FILES)
    target = rig.target(pod="uid-1", volume="gpustack-model")

    async with rig.running() as plugin:
        await publish_until_done(plugin.socket, publish_request(record, target, volume_id="csi-x"))
    for ref in (rig.settings.cache_root / "ledger" / "refs").iterdir():
        ref.unlink()  # the ledger is lost; the mount is the truth
    try:
        async with rig.running() as plugin:
            refs = dict(plugin.volumes.refs)
            await unpublish(plugin.socket, next(iter(refs)), target)
            mounted_after = mounting.is_mount_point(target)
    finally:
        while mounting.is_mount_point(target) is not None:
            mounting.unmount(target)

    import hashlib

    expected = "csi-" + hashlib.sha256(b"uid-1gpustack-model").hexdigest()
    assert list(refs) == [expected]
    assert refs[expected].hex == (record.manifest_digest or "")[7:]
    assert mounted_after is None

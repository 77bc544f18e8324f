"""A restart with NATS down: the policy kept on the node serves what is cached, nothing more."""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import grpc
import pytest
from models_harness import (
    FILES,
    code_of,
    content,
    manager_settings,
    manifest_of,
    publish_request,
    publish_until_done,
    unpublish,
)

from agent.models import mounting, policyfile, running
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings
from bus import connection, kv, state, testing
from bus.records import ArtifactRecord, HuggingFaceSource, StoreSpecRecord
from hub import testing as hub_testing
from kit import serving

pytestmark = pytest.mark.anyio

OTHER = {"weights.bin": content(4096, 7)}


def _record(name: str, files: dict[str, bytes], commit: str) -> ArtifactRecord:
    return ArtifactRecord(
        namespace="team-a",
        name=name,
        uid=f"uid-{name}",
        source=HuggingFaceSource(repository=f"org/{name}"),
        manifest_digest=manifest_of(files).digest,
        revision=commit,
    )


def _target(settings: ModelManagerSettings, pod: str) -> Path:
    target = settings.pods_dir / pod / "volumes" / "kubernetes.io~csi" / "m" / "mount"
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def test_a_kept_policy_of_another_format_or_node_is_refused() -> None:
    policy = MemoryPolicy([_record("llm", FILES, "c1")])
    data = policyfile.encode("node-1", policy)
    kept = policyfile.decode(data, "node-1")
    assert [a.name for a in kept.artifacts] == ["llm"]
    with pytest.raises(policyfile.Unusable, match="node 'node-1'"):
        policyfile.decode(data, "node-2")
    with pytest.raises(policyfile.Unusable, match="not a gpustack-model-policy/v1 file"):
        policyfile.decode(data.replace(b"/v1", b"/v2"), "node-1")
    with pytest.raises(policyfile.Unusable):
        policyfile.decode(b"{", "node-1")


async def test_a_corrupt_kept_policy_is_logged_and_the_plugin_waits_for_the_bus(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = policyfile.path_in(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00not json")
    assert await policyfile.load(path, "node-1") is None
    assert "ignoring the kept policy" in caplog.text


async def _sync_and_publish(
    settings: ModelManagerSettings, records: list[ArtifactRecord], target: Path
) -> None:
    """First run, NATS up: the worker's records synced, ``records[0]`` published at ``target``."""
    assert settings.bus is not None
    async with connection.connect(settings.bus, retry=False) as conn:
        await state.ensure_streams(conn, settings.bus)  # the worker's job
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
        for record in records:
            await bucket.put_record(kv.artifact_key(record.namespace, record.name), record)
        await bucket.put_record(kv.nms_key("node-1"), StoreSpecRecord(node="node-1", spec={}))
        policy = MemoryPolicy()
        async with anyio.create_task_group() as tg:
            tg.start_soon(running.serve, settings, policy)

            async def kept() -> bool:
                return policy.synced() and policyfile.path_in(settings.cache_root).exists()

            await testing.eventually(kept)
            request = publish_request(records[0], target, volume_id="csi-one")
            await publish_until_done(settings.socket_path, request)
            tg.cancel_scope.cancel()


async def test_a_restart_without_the_bus_mounts_cached_models_only(
    tmp_path: Path, mounts: None
) -> None:
    hub = hub_testing.FakeHub(tmp_path / "hub")
    cached = _record("llm", FILES, hub.add("org/llm", FILES))
    uncached = _record("other", OTHER, hub.add("org/other", OTHER))
    https = serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="none")
    async with hub_testing.serving(hub) as ep:
        async with testing.nats_server(tmp_path / "nats") as nats:
            bus = testing.settings_for(nats)
            settings = manager_settings(tmp_path, ep.hub, https=https, bus=bus)
            first = _target(settings, "pod-1")
            await _sync_and_publish(settings, [cached, uncached], first)
        kept = policyfile.path_in(settings.cache_root)
        assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600

        policy = MemoryPolicy()  # NATS is gone: nothing will sync this
        second = _target(settings, "pod-2")
        async with anyio.create_task_group() as tg:
            tg.start_soon(running.serve, settings, policy)
            await testing.eventually(_exists(settings.socket_path))
            mounted = await code_of(
                settings.socket_path, publish_request(cached, second, volume_id="csi-two")
            )
            refused = await code_of(
                settings.socket_path,
                publish_request(uncached, _target(settings, "pod-3"), volume_id="csi-three"),
            )
            still_mounted = mounting.is_mount_point(first) is not None
            await unpublish(settings.socket_path, "csi-one", first)
            await unpublish(settings.socket_path, "csi-two", second)
            synced = policy.synced()
            tg.cancel_scope.cancel()

    assert still_mounted  # the first run's mount outlived it, as a pod's does
    assert mounted == (grpc.StatusCode.OK, "")
    assert refused[0] == grpc.StatusCode.UNAVAILABLE, refused
    assert "not cached" in refused[1]
    assert not synced and policy.provisional()
    assert mounting.is_mount_point(first) is None and not first.exists()
    assert mounting.is_mount_point(second) is None and not second.exists()


def _exists(path: Path) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await anyio.Path(path).exists()

    return check

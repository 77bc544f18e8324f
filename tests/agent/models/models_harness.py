"""Harness for the model plugin tests: a fake Hub over HTTP, the plugin, a grpcio CSI client."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import grpc
import pytest

from agent.models import running
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings, Tuning
from bus import events
from bus import testing as bus_testing
from bus.records import ArtifactRecord, HuggingFaceSource
from hub import testing
from hub.manifest import Entry, Manifest
from proto.csi import v1 as csi

T = TypeVar("T")
KiB = 1024
TUNING = Tuning(
    segment_bytes=256 * KiB,
    chunk_bytes=64 * KiB,
    checkpoint_bytes=256 * KiB,
    sync_behind_bytes=512 * KiB,
    retry_delay_s=0.01,
    report_every_s=0.0,
    publish_wait_s=0.0,  # answer ABORTED at once; tests of the held call set their own window
)


def _probe_mount(tmp: Path) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    src, dst = tmp / "src", tmp / "dst"
    src.mkdir()
    dst.mkdir()
    if libc.mount(os.fsencode(src), os.fsencode(dst), None, 4096, None) != 0:
        return False
    libc.umount2(os.fsencode(dst), 2)
    return True


@pytest.fixture(scope="session")
def can_mount(tmp_path_factory: pytest.TempPathFactory) -> bool:
    return _probe_mount(tmp_path_factory.mktemp("mount-probe"))


@pytest.fixture
def mounts(can_mount: bool) -> None:
    if not can_mount:
        pytest.skip("bind mounts are refused here (not root, or no CAP_SYS_ADMIN)")


def content(n: int, seed: int = 0) -> bytes:
    """Deterministic, non-repeating bytes."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(b"%d-%d" % (seed, counter)).digest()
        counter += 1
    return bytes(out[:n])


FILES = {
    "config.json": b'{"architectures": ["Fake"]}',
    "tokenizer/vocab.txt": b"a\nb\nc\n",
    "model-00001.safetensors": content(3 * 1024 * KiB + 123, 1),  # 3 MiB: 13 segments
    "model-00002.safetensors": content(200 * KiB, 2),
    "empty.txt": b"",
}


def manifest_of(files: dict[str, bytes]) -> Manifest:
    def entry(path: str, data: bytes) -> Entry:
        if len(data) >= 1024:
            return Entry("sha256", hashlib.sha256(data).hexdigest(), len(data), path)
        return Entry("gitsha1", testing.git_blob_sha1(data), len(data), path)

    return Manifest.of(entry(p, d) for p, d in files.items())


class Sink:
    def __init__(self) -> None:
        self.events: list[events.Event] = []

    def publish(self, event: events.Event) -> None:
        self.events.append(event)


@dataclass
class Rig:
    hub: testing.FakeHub
    endpoints: testing.Endpoints
    policy: MemoryPolicy
    settings: ModelManagerSettings
    sink: Sink
    tmp: Path

    def artifact(
        self,
        repository: str,
        files: dict[str, bytes],
        *,
        name: str = "llm",
        namespace: str = "team-a",
        token: str | None = None,
    ) -> ArtifactRecord:
        commit = self.hub.add(repository, files, token=token)
        record = ArtifactRecord(
            namespace=namespace,
            name=name,
            uid=str(uuid.uuid4()),
            source=HuggingFaceSource(repository=repository),
            manifest_digest=manifest_of(files).digest,
            revision=commit,
        )
        self.policy.put(record)
        return record

    def target(self, pod: str = "pod-1", volume: str = "model") -> Path:
        parent = self.settings.pods_dir / pod / "volumes" / "kubernetes.io~csi" / volume
        parent.mkdir(parents=True, exist_ok=True)
        return parent / "mount"

    @asynccontextmanager
    async def running(self) -> AsyncIterator[running.Plugin]:
        async with running.plugin(self.settings, policy=self.policy, sink=self.sink) as p:
            yield p


def manager_settings(tmp_path: Path, hub_endpoint: str, **kw: Any) -> ModelManagerSettings:
    """A model manager's settings rooted in ``tmp_path`` (kubelet dir, cache, CSI socket), fast tuning."""
    return ModelManagerSettings(
        node_name="node-1",
        kubelet_dir=tmp_path / "kubelet",
        cache_root=tmp_path / "cache",
        csi_socket=tmp_path / "csi.sock",
        hub_endpoint=hub_endpoint,
        tuning=TUNING,
        **kw,
    )


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    hub = testing.FakeHub(tmp_path / "hub", page_size=3)
    async with testing.serving(hub) as endpoints:
        settings = manager_settings(tmp_path, endpoints.hub)
        yield Rig(hub, endpoints, MemoryPolicy([]), settings, Sink(), tmp_path)


def publish_request(
    record: ArtifactRecord,
    target: Path,
    *,
    volume_id: str = "csi-abc",
    token: str | None = None,
    **overrides: str,
) -> csi.NodePublishVolumeRequest:
    context = {
        "artifact": record.name,
        "artifactUID": record.uid,
        "manifestDigest": record.manifest_digest or "",
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.namespace": record.namespace,
        "csi.storage.k8s.io/pod.name": "pod-1",
        **overrides,
    }
    return csi.NodePublishVolumeRequest(
        volume_id=volume_id,
        target_path=str(target),
        volume_capability=csi.VolumeCapability(
            mount=csi.VolumeCapabilityMountVolume(),
            access_mode=csi.VolumeCapabilityAccessMode(
                mode=csi.VolumeCapabilityAccessModeMode.SINGLE_NODE_WRITER
            ),
        ),
        readonly=True,
        secrets={"token": token} if token else {},
        volume_context=context,
    )


def _unary(socket: Path, method: str, request: Any, reply: Callable[[bytes], T]) -> T:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=reply)
        result: T = call(request, timeout=10)
        return result


async def call(
    socket: Path,
    method: str,
    request: Any,
    reply: Callable[[bytes], T],
    *,
    limiter: anyio.CapacityLimiter | None = None,
) -> T:
    """One unary CSI call from grpcio (C-core), run in a thread.

    Many concurrent calls need their own ``limiter``: blocked in the default thread pool, they
    would starve the plugin (same event loop) of the threads it needs to answer them.
    """
    return await anyio.to_thread.run_sync(_unary, socket, method, request, reply, limiter=limiter)


async def publish(
    socket: Path,
    request: csi.NodePublishVolumeRequest,
    *,
    limiter: anyio.CapacityLimiter | None = None,
) -> csi.NodePublishVolumeResponse:
    return await call(
        socket,
        "/csi.v1.Node/NodePublishVolume",
        request,
        csi.NodePublishVolumeResponse.FromString,
        limiter=limiter,
    )


async def unpublish(
    socket: Path, volume_id: str, target: Path, *, limiter: anyio.CapacityLimiter | None = None
) -> None:
    await call(
        socket,
        "/csi.v1.Node/NodeUnpublishVolume",
        csi.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target)),
        csi.NodeUnpublishVolumeResponse.FromString,
        limiter=limiter,
    )


async def code_of(
    socket: Path, request: csi.NodePublishVolumeRequest
) -> tuple[grpc.StatusCode, str]:
    try:
        await publish(socket, request)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


async def publish_until_done(
    socket: Path, request: csi.NodePublishVolumeRequest, *, attempts: int = 400
) -> list[str]:
    """Retry like kubelet while ABORTED; returns the progress messages seen."""
    seen = []
    for _ in range(attempts):
        code, message = await code_of(socket, request)
        if code == grpc.StatusCode.OK:
            return seen
        if code != grpc.StatusCode.ABORTED:
            raise AssertionError(f"{code}: {message}")
        seen.append(message)
        await anyio.sleep(0.02)
    raise AssertionError(f"still materializing after {attempts} tries: {seen[-1:]}")


async def settled(plugin: running.Plugin) -> None:
    """Wait until no download job is running (the last attempt finished or failed)."""

    async def idle() -> bool:
        return not plugin.materializer.jobs

    await bus_testing.eventually(idle)

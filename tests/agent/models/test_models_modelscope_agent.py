"""The model agent materializes a ``source.modelScope`` artifact: a real CSI call (grpcio) to the
real plugin, which downloads from a real fake ModelScope (:mod:`hub.testing_modelscope`) found
through the NodeModelStore spec's ``hub.modelScopeEndpoint``, and publishes a tree whose digest
the test computes itself from the bytes."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import grpc
import msgspec
import pytest
from models_harness import Sink, code_of, manager_settings, publish_request, settled

from agent.models import backoff, materializing, policy, running
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings, settings_from
from bus.records import ArtifactRecord, HubEndpoint, ModelScopeSource, StoreSpec
from gpustack_operator.main import options_for
from hub.testing_modelscope import FakeModelScope, serving
from kit.options import SettingsError

pytestmark = pytest.mark.anyio
FILES = {
    "configuration.json": b'{"task": "text-generation"}',
    "model.safetensors": bytes(range(256)) * 3000,
    "sub/dir/tokenizer.model": b"\x00\x01tokens" * 100,
}


def independent_digest(files: dict[str, bytes]) -> str:
    text = "gpustack-manifest v1\n"
    for path in sorted(files, key=lambda p: p.encode()):
        text += f"sha256:{hashlib.sha256(files[path]).hexdigest()} {len(files[path])} {path}\n"
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def record_of(fake: FakeModelScope, repository: str, *, token: str | None = None) -> ArtifactRecord:
    commit = fake.add(repository, FILES, token=token)
    return ArtifactRecord(
        namespace="team",
        name="ms",
        uid=str(uuid.uuid4()),
        model_scope=ModelScopeSource(repository=repository),
        manifest_digest=independent_digest(FILES),
        revision=commit,
    )


async def _materialize(
    tmp: Path, url: str, record: ArtifactRecord, *, token: str | None = None
) -> tuple[grpc.StatusCode, str, Path]:
    """Ask the plugin for the volume once (it answers ABORTED while it downloads), wait for the
    job to end; the first answer, its message, and the tree's path."""
    spec = StoreSpec(hub=HubEndpoint(model_scope_endpoint=url))
    policy = MemoryPolicy([record], spec)
    settings = manager_settings(tmp, "http://127.0.0.1:9", hub_token="hf-node-secret")
    target = settings.pods_dir / "pod-1" / "volumes" / "kubernetes.io~csi" / "model" / "mount"
    target.parent.mkdir(parents=True)
    async with running.plugin(settings, policy=policy, sink=Sink()) as plugin:
        code, message = await code_of(plugin.socket, publish_request(record, target, token=token))
        await settled(plugin)
    hex_ = (record.manifest_digest or "").removeprefix("sha256:")
    return code, message, settings.cache_root / "published" / hex_ / "tree"


async def test_a_modelscope_volume_is_materialized_to_the_independent_digest(
    tmp_path: Path,
) -> None:
    fake = FakeModelScope()
    async with serving(fake) as url:
        record = record_of(fake, "qwen/Tiny")
        code, message, tree = await _materialize(tmp_path, url, record)
    assert code == grpc.StatusCode.ABORTED, message  # downloading: kubelet asks again
    assert {p: (tree / p).read_bytes() for p in FILES} == FILES
    files = fake.file_requests()
    assert {s.query["FilePath"] for s in files} == set(FILES)
    assert all(s.query["Revision"] == record.revision for s in files)
    # The node's own (Hugging Face) token never reaches ModelScope.
    assert all(s.authorization is None and s.cookie is None for s in fake.seen)


async def test_a_private_modelscope_volume_uses_the_volume_token(tmp_path: Path) -> None:
    fake = FakeModelScope()
    async with serving(fake) as url:
        record = record_of(fake, "org/private", token="ms-good")
        _, _, tree = await _materialize(tmp_path, url, record, token="ms-good")
    assert {p: (tree / p).read_bytes() for p in FILES} == FILES
    assert {s.cookie for s in fake.file_requests()} == {"ms-good"}


async def test_a_corrupted_modelscope_file_is_never_published(tmp_path: Path) -> None:
    fake = FakeModelScope()
    async with serving(fake) as url:
        record = record_of(fake, "qwen/Tiny")
        fake.corrupt.add("model.safetensors")
        _, _, tree = await _materialize(tmp_path, url, record)
    assert not tree.exists()


class OldSource(msgspec.Struct):
    repository: str


class OldRecord(msgspec.Struct, rename="camel"):
    """``ArtifactRecord`` as agents before ModelScope read it."""

    namespace: str
    name: str
    uid: str
    source: OldSource


def test_a_modelscope_source_never_shares_a_hugging_face_backoff() -> None:
    """Same repository id, commit and token on both hubs: two sources, two backoff keys."""
    hf = materializing.Source("org/m", "a" * 40, None)
    ms = materializing.Source("org/m", "a" * 40, None, hub="modelscope")
    assert hf.key != ms.key and hf.key == backoff.source_key("org/m", "a" * 40, None)


def test_a_record_naming_no_hub_is_refused_and_old_records_still_decode() -> None:
    record = ArtifactRecord(
        namespace="team", name="x", uid="u", manifest_digest="sha256:" + "a" * 64, revision="c"
    )
    ask = policy.VolumeAsk("team", "x", "u", "sha256:" + "a" * 64)
    with pytest.raises(policy.Denied, match="the ModelArtifact is not on a model hub"):
        policy.authorize(ask, record)
    # A record a worker wrote before ModelScope existed still reads as a Hugging Face one.
    old = b'{"namespace":"t","name":"n","uid":"u","source":{"repository":"org/m"}}'
    assert msgspec.json.decode(old, type=ArtifactRecord).hub == ("huggingface", "org/m")

    # A reader from before ModelScope (``source`` required) cannot decode a ModelScope
    # record, so it skips it rather than fetching the repository from Hugging Face.
    new = msgspec.json.encode(
        ArtifactRecord(
            namespace="t", name="n", uid="u", model_scope=ModelScopeSource(repository="o/m")
        )
    )
    with pytest.raises(msgspec.ValidationError, match="source"):
        msgspec.json.decode(new, type=OldRecord)


def test_the_model_agent_reads_the_modelscope_environment() -> None:
    def settings(env: dict[str, str]) -> ModelManagerSettings:
        return settings_from(options_for(("model-manager",), [], env))

    assert settings({}).modelscope_endpoint == "https://www.modelscope.cn"
    assert settings({"MODELSCOPE_DOMAIN": "www.modelscope.ai"}).modelscope_endpoint == (
        "https://www.modelscope.ai"
    )
    both = {"MODELSCOPE_ENDPOINT": "http://mirror:8080", "MODELSCOPE_DOMAIN": "x.cn"}
    assert settings(both).modelscope_endpoint == "http://mirror:8080"
    with pytest.raises(SettingsError, match="MODELSCOPE_ENDPOINT or MODELSCOPE_DOMAIN"):
        settings({"MODELSCOPE_ENDPOINT": "http://[::1"})


async def test_a_bad_modelscope_endpoint_stops_the_agent_in_one_line() -> None:
    """The real console script: exit 2, one line, before any socket is opened."""
    import os
    import sys

    import anyio

    cli = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELSCOPE_", "GPUSTACK_"))}
    with anyio.fail_after(60):  # a bug that let it start must fail here, not hang the run
        result = await anyio.run_process(
            [cli, "mm", "--node-name", "n1"], env={**env, "MODELSCOPE_ENDPOINT": "ftp://x"},
            check=False,
        )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 2 and err.count("\n") == 1 and "MODELSCOPE_ENDPOINT" in err, err

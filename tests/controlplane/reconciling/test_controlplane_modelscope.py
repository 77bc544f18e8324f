"""ModelArtifacts with ``source.modelScope``: the real worker, the fake Kubernetes API, a real
nats-server and a real fake ModelScope (:mod:`hub.testing_modelscope`) that the setting
``model-artifact-modelscope-endpoint`` names. The digest is computed a second time here, from the
bytes, with :mod:`hashlib` alone."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api
from test_controlplane_crds import validator
from test_controlplane_modelartifacts import condition, record_of, settled

from bus import records
from bus.settings import BusSettings
from bus.testing import eventually, nats_server, settings_for
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.clustersettings.catalog import DEFAULTS
from controlplane.k8s.client import KubeSettings
from controlplane.reconciling import artifacts
from controlplane.stores import storespec
from controlplane.worker import leading, running
from hub.testing_modelscope import FakeModelScope, serving
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio
ARTIFACTS = "apis/worker.gpustack.ai/v1alpha1/modelartifacts"
FILES = {
    "configuration.json": b'{"framework": "pytorch"}',
    "model.safetensors": bytes(range(256)) * 16,
    "README.md": b"# hello\n",
}
TOKEN = "ms-secret-token"


def independent_digest(files: dict[str, bytes]) -> str:
    text = "gpustack-manifest v1\n"
    for path in sorted(files, key=lambda p: p.encode()):
        text += f"sha256:{hashlib.sha256(files[path]).hexdigest()} {len(files[path])} {path}\n"
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Env:
    fake: FakeApi
    modelscope: FakeModelScope
    bus: BusSettings
    worker: running.Worker


@asynccontextmanager
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    fake_ms = FakeModelScope()
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        serving(fake_ms) as ms_url,
        anyio.create_task_group() as tg,
    ):
        seed = settingscatalog.seed({"GPUSTACK_MODEL_ARTIFACT_MODELSCOPE_ENDPOINT": ms_url})
        settings = running.WorkerSettings(
            concurrency=16,
            bus=settings_for(server),
            kube=KubeSettings.for_tests(url, backoff_s=0.01),
            https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
            leader=leading.LeaderSettings(name="w", namespace="ns", lease_s=5, renew_timeout_s=3),
            identity="w1",
            resync_s=3600.0,
            artifact_retry_base_s=0.01,
            artifact_retry_cap_s=0.5,
            settings_seed=seed,
            settings_period_s=0.1,
            hub_endpoint="http://127.0.0.1:9",  # no Hugging Face here: never asked
        )
        w = await tg.start(lambda task_status: running.run(settings, task_status=task_status))
        yield Env(fake, fake_ms, settings.bus, w)
        tg.cancel_scope.cancel()


def artifact(name: str, source: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"source": source, **spec},
    }


async def test_a_modelscope_artifact_resolves_and_reaches_the_agents(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        commit = e.modelscope.add("qwen/Tiny", FILES, token=TOKEN)
        secret = base64.b64encode(TOKEN.encode()).decode()
        e.fake.put_object("api/v1/secrets", {
            "metadata": {"name": "ms", "namespace": "team"}, "data": {"token": secret},
        })  # fmt: skip
        source = {"modelScope": {"repository": "qwen/Tiny", "secretRef": {"name": "ms"}}}
        e.fake.put_object(ARTIFACTS, artifact("tiny", source))
        obj = await settled(e.fake, "tiny", "Resolved", "True", "Resolved")
        resolved = obj["status"]["resolved"]
        assert resolved["manifestDigest"] == independent_digest(FILES)
        assert resolved["revision"] == commit  # master, the ModelScope default branch
        assert (resolved["fileCount"], resolved["sizeBytes"]) == (3, sum(map(len, FILES.values())))
        # The token went to ModelScope as the SDK sends it; the token check was not needed.
        api = [s for s in e.modelscope.seen if s.path.startswith("/api/v1/")]
        assert api and all(s.cookie == TOKEN for s in api)

        async def pushed() -> bool:
            return b"manifestDigest" in (await record_of(e.bus, "tiny") or b"")

        await eventually(pushed)
        raw = await record_of(e.bus, "tiny")
        assert raw is not None and TOKEN.encode() not in raw
        rec = msgspec.json.decode(raw, type=records.ArtifactRecord)
        assert rec.hub == ("modelscope", "qwen/Tiny") and rec.source is None
        assert rec.model_scope == records.ModelScopeSource(repository="qwen/Tiny")
        assert rec.token_secret == records.SecretRef(namespace="team", name="ms")
        assert rec.manifest_digest == independent_digest(FILES) and rec.revision == commit


async def test_a_changed_endpoint_setting_applies_to_the_next_artifact(tmp_path: Path) -> None:
    """The setting is read at each resolution: after it changes in the settings Secret, the
    next artifact resolves against the new endpoint, with no restart."""
    other = FakeModelScope()
    moved = {"moved.bin": b"served by the other endpoint"}
    async with env(tmp_path) as e, serving(other) as other_url:
        first = e.modelscope.add("org/m", FILES)
        second = other.add("org/m", moved)
        e.fake.put_object(ARTIFACTS, artifact("one", {"modelScope": {"repository": "org/m"}}))
        one = await settled(e.fake, "one", "Resolved", "True", "Resolved")
        assert one["status"]["resolved"]["revision"] == first

        key = ("api/v1/secrets", "gpustack-system", settingscatalog.SECRET_NAME)
        secret = e.fake.objects[key]
        name = "model-artifact-modelscope-endpoint"
        secret["data"] = {**secret["data"], name: base64.b64encode(other_url.encode()).decode()}

        async def changed() -> bool:
            source = e.worker.settings
            return source is not None and (
                source.values.model_artifact_modelscope_endpoint == other_url
            )

        await eventually(changed)
        e.fake.put_object(ARTIFACTS, artifact("two", {"modelScope": {"repository": "org/m"}}))
        two = await settled(e.fake, "two", "Resolved", "True", "Resolved")
    assert two["status"]["resolved"]["revision"] == second
    assert two["status"]["resolved"]["manifestDigest"] == independent_digest(moved)
    # The first artifact stays pinned where it resolved.
    assert e.fake.objects[(ARTIFACTS, "team", "one")]["status"]["resolved"]["revision"] == first


async def test_modelscope_refusals_name_the_reason(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        e.modelscope.add("org/private", FILES, token=TOKEN)
        e.modelscope.add("org/public", FILES)
        e.fake.put_object("api/v1/secrets", {
            "metadata": {"name": "bad", "namespace": "team"},
            "data": {"token": base64.b64encode(b"ms-wrong").decode()},
        })  # fmt: skip
        both = {"modelScope": {"repository": "org/public"}, "huggingFace": {"repository": "a/b"}}
        cases = {
            "denied": ({"modelScope": {"repository": "org/private"}}, "AccessDenied"),
            "badtoken": (
                {"modelScope": {"repository": "org/private", "secretRef": {"name": "bad"}}},
                "AccessDenied",
            ),
            "rev": (
                {"modelScope": {"repository": "org/public", "revision": "v9"}},
                "RevisionNotFound",
            ),
            "both": (both, "InvalidSpec"),
        }
        for name, (source, _) in cases.items():
            e.fake.put_object(ARTIFACTS, artifact(name, source))
        for name, (_, reason) in cases.items():
            obj = await settled(e.fake, name, "Degraded", "True", reason)
            assert "resolved" not in obj["status"]
        bad = condition(e.fake.objects[(ARTIFACTS, "team", "badtoken")], "Degraded")
        assert "the token itself is refused" in bad["message"]


def test_the_crd_takes_exactly_one_hub_source() -> None:
    v = validator("modelartifacts")
    v.validate({"spec": {"source": {"modelScope": {"repository": "qwen/Qwen3-8B"}}}})
    hf = {"huggingFace": {"repository": "a/b"}}
    assert not v.is_valid({"spec": {"source": {**hf, "modelScope": {"repository": "c/d"}}}})
    assert not v.is_valid({"spec": {"source": {}}})
    assert not v.is_valid({"spec": {"source": {"modelScope": {}}}})


def test_spec_parsing_and_the_record() -> None:
    body = artifact("x", {"modelScope": {"repository": "qwen/Tiny", "revision": "v1"}})
    body["metadata"]["uid"] = "u1"
    spec = artifacts.parse_spec(body)
    assert isinstance(spec, artifacts.Spec) and spec.source.hub[0] == "modelscope"
    rec = artifacts.record(body, spec)
    assert rec is not None and rec.model_scope == records.ModelScopeSource(
        repository="qwen/Tiny", revision="v1"
    )
    empty = artifacts.parse_spec(artifact("y", {"modelScope": {"repository": ""}}))
    assert isinstance(empty, artifacts.Failure) and "modelScope.repository" in empty.message
    none = artifacts.parse_spec(artifact("z", {}))
    assert isinstance(none, artifacts.Failure) and "exactly one" in none.message


def test_the_setting_reaches_the_node_model_store_spec() -> None:
    spec = storespec.from_settings(
        msgspec.structs.replace(DEFAULTS, model_artifact_modelscope_endpoint="https://ms.local")
    )
    assert spec["hub"]["modelScopeEndpoint"] == "https://ms.local"
    assert not settingscatalog.BY_NAME["model-artifact-modelscope-endpoint"].inert
    parsed = msgspec.convert(spec, records.StoreSpec)
    assert parsed.hub.model_scope_endpoint == "https://ms.local" and not parsed.problems()

"""ModelArtifacts end to end: a real HTTP Hub (hub.testing), the fake API, a real nats-server."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node

import hub
from bus import codec, connection, embedded, events, kv, records, subjects
from bus.settings import BusSettings
from bus.testing import eventually, nats_server, settings_for
from controlplane import errors
from controlplane.k8s.client import KubeSettings
from controlplane.reconciling import hubresolver
from controlplane.worker import leading, running
from hub import testing as hub_testing
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio
ARTIFACTS = "apis/worker.gpustack.ai/v1alpha1/modelartifacts"
FILES = {
    "config.json": b'{"a": 1}',
    "model.safetensors": bytes(range(256)) * 16,
    "README.md": b"# hello\n",
}
TOKEN = "hf_secret_token_value"


@dataclass
class Env:
    fake: FakeApi
    hub: hub_testing.FakeHub
    endpoint: str
    bus: BusSettings
    worker: running.Worker
    resolver: Flaky


class Flaky:
    """A :class:`Resolver` failing ``times`` times with a temporary error, then the real one."""

    def __init__(self, inner: hubresolver.Resolver, times: int) -> None:
        self.inner, self.left, self.calls, self.revalidations = inner, times, 0, 0
        self.unavailable = 0
        """Revalidations still to fail with SourceUnavailable (the Hub answering 503)."""

    async def resolve(
        self,
        repository: str,
        revision: str,
        *,
        token: str | None,
        allow: Sequence[str],
        ignore: Sequence[str],
    ) -> hubresolver.Resolved:
        self.calls += 1
        if repository == "org/flaky" and self.left > 0:
            self.left -= 1
            raise errors.ResolveFailed("SourceUnavailable", "HTTP 503", temporary=True)
        return await self.inner.resolve(
            repository, revision, token=token, allow=allow, ignore=ignore
        )

    async def revalidate(
        self,
        repository: str,
        commit: str,
        digest: str,
        *,
        token: str | None,
        allow: Sequence[str],
        ignore: Sequence[str],
    ) -> None:
        self.revalidations += 1
        if self.unavailable > 0:
            self.unavailable -= 1
            raise errors.ResolveFailed("SourceUnavailable", "HTTP 503", temporary=True)
        await self.inner.revalidate(
            repository, commit, digest, token=token, allow=allow, ignore=ignore
        )


@asynccontextmanager
async def env(
    tmp_path: Path, flaky: int = 0, resync_s: float = 3600.0, *, hub_down: bool = False
) -> AsyncIterator[Env]:
    """``hub_down``: the resolver's Hub is a loopback port nothing listens on."""
    fake_hub = hub_testing.FakeHub(tmp_path / "hub", page_size=2)
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        hub_testing.serving(fake_hub) as endpoints,
        hubresolver.hub_resolver(
            f"http://127.0.0.1:{embedded.free_port()}" if hub_down else endpoints.hub
        ) as real,
        anyio.create_task_group() as tg,
    ):
        settings = running.WorkerSettings(
            concurrency=16,
            bus=settings_for(server),
            kube=KubeSettings.for_tests(url, backoff_s=0.01),
            https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
            leader=leading.LeaderSettings(name="w", namespace="ns", lease_s=5, renew_timeout_s=3),
            identity="w1",
            resync_s=resync_s,
            artifact_retry_base_s=0.01,
            artifact_retry_cap_s=0.5,
        )
        resolver = Flaky(real, flaky)
        w = await tg.start(lambda task_status: running.run(
            settings, resolver=resolver, task_status=task_status
        ))  # fmt: skip
        yield Env(fake, fake_hub, endpoints.hub, settings.bus, w, resolver)
        tg.cancel_scope.cancel()


def artifact(name: str, repository: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"source": {"huggingFace": {"repository": repository, **spec.pop("hf", {})}}}
        | spec,
    }


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == kind), {})


async def settled(fake: FakeApi, name: str, kind: str, status: str, reason: str) -> dict[str, Any]:
    async def check() -> bool:
        obj = fake.objects.get((ARTIFACTS, "team", name))
        c = condition(obj, kind) if obj else {}
        return c.get("status") == status and c.get("reason") == reason

    await eventually(check)
    return fake.objects[(ARTIFACTS, "team", name)]


async def record_of(bus: BusSettings, name: str) -> bytes | None:
    async with connection.connect(bus, name="reader") as conn:
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
        got = await bucket.get(kv.artifact_key("team", name))
        return got[0] if got else None


async def test_public_and_private_artifacts_resolve_and_reach_the_agents(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        e.hub.add("org/public", FILES)
        commit = e.hub.add("org/private", FILES, token=TOKEN)
        secret = base64.b64encode(TOKEN.encode()).decode()
        e.fake.put_object("api/v1/secrets", {
            "metadata": {"name": "hf", "namespace": "team"}, "data": {"token": secret},
        })  # fmt: skip
        e.fake.put_object(ARTIFACTS, artifact("pub", "org/public", ignorePatterns=["*.md"]))
        e.fake.put_object(
            ARTIFACTS, artifact("priv", "org/private", hf={"secretRef": {"name": "hf"}})
        )
        pub = await settled(e.fake, "pub", "Resolved", "True", "Resolved")
        expected = await hub.resolve("org/public", endpoint=e.endpoint, ignore=["*.md"])
        assert pub["status"]["resolved"]["manifestDigest"] == expected.digest
        assert pub["status"]["resolved"]["fileCount"] == 2
        assert pub["status"]["resolved"]["sizeBytes"] == expected.size
        assert condition(pub, "Degraded")["status"] == "False"
        priv = await settled(e.fake, "priv", "Resolved", "True", "Resolved")
        assert priv["status"]["resolved"]["revision"] == commit

        async def pushed() -> bool:
            return b"manifestDigest" in (await record_of(e.bus, "priv") or b"")

        await eventually(pushed)
        raw = await record_of(e.bus, "priv")
        assert raw is not None and TOKEN.encode() not in raw and secret.encode() not in raw
        rec = msgspec.json.decode(raw, type=records.ArtifactRecord)
        assert rec.token_secret == records.SecretRef(namespace="team", name="hf")
        assert rec.manifest_digest == priv["status"]["resolved"]["manifestDigest"]
        assert rec.uid == priv["metadata"]["uid"] and rec.revision == commit

        # A node reports the model ready: status.nodes follows. (Without its Node object the
        # node would be refused and forgotten, models included.)
        e.fake.put_object("api/v1/nodes", node("n1"))
        digest = pub["status"]["resolved"]["manifestDigest"]
        async with connection.connect(e.bus, name="agent") as conn:
            ev = events.ModelsEvent(node="n1", ts=datetime.now(UTC), models=(
                events.ModelState(model=digest, state="ready", bytes_total=1),))  # fmt: skip
            await conn.publish(subjects.subject("n1", "models"), codec.encode(ev))

        async def counted() -> bool:
            obj = e.fake.objects[(ARTIFACTS, "team", "pub")]
            return bool(obj["status"]["nodes"] == {"ready": 1, "downloading": 0, "failed": 0})

        await eventually(counted)

        # Deleted: the agents lose the record.
        e.fake.remove(ARTIFACTS, "pub", "team")

        async def dropped() -> bool:
            return await record_of(e.bus, "pub") is None

        await eventually(dropped)


async def test_refusals_degrade_and_name_the_reason(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        e.hub.add("org/private", FILES, token=TOKEN)
        e.hub.add("org/public", FILES)
        wrong = "sha256:" + "0" * 64
        e.fake.put_object(ARTIFACTS, artifact("denied", "org/private"))
        e.fake.put_object(ARTIFACTS, artifact("missing", "org/nope"))
        e.fake.put_object(ARTIFACTS, artifact("rev", "org/public", hf={"revision": "v9"}))
        e.fake.put_object(ARTIFACTS, artifact("digest", "org/public", expectedDigest=wrong))
        e.fake.put_object(ARTIFACTS, artifact("nosecret", "org/public",
                                              hf={"secretRef": {"name": "absent"}}))  # fmt: skip
        for name, source in (
            ("pvc", {"persistentVolumeClaim": {"claimName": "models"}}),
            ("img", {"image": {"reference": "r.io/m@sha256:" + "1" * 64}}),
        ):
            body = artifact(name, "unused")
            body["spec"]["source"] = source
            e.fake.put_object(ARTIFACTS, body)  # fmt: skip
        for name, reason in [
            ("denied", "AccessDenied"),
            ("missing", "AccessDenied"),
            ("rev", "RevisionNotFound"),
            ("digest", "DigestMismatch"),
            ("nosecret", "SecretNotFound"),
            ("pvc", "SourceNotSupported"),
            ("img", "SourceNotSupported"),
        ]:
            obj = await settled(e.fake, name, "Degraded", "True", reason)
            assert condition(obj, "Resolved")["status"] == "False"
            assert "resolved" not in obj["status"]
        digest = e.fake.objects[(ARTIFACTS, "team", "digest")]
        assert wrong in condition(digest, "Degraded")["message"]
        denied = condition(e.fake.objects[(ARTIFACTS, "team", "denied")], "Degraded")
        assert "org/private" in denied["message"]
        pvc = condition(e.fake.objects[(ARTIFACTS, "team", "pvc")], "Degraded")["message"]
        assert pvc.startswith("a persistentVolumeClaim source is not supported by this build")
        assert await record_of(e.bus, "pvc") is None  # nothing for the agents to mount


async def test_temporary_failures_are_retried_and_spec_changes_refused(tmp_path: Path) -> None:
    async with env(tmp_path, flaky=3) as e:
        e.hub.add("org/flaky", FILES)
        e.fake.put_object(ARTIFACTS, artifact("f", "org/flaky"))
        obj = await settled(e.fake, "f", "Resolved", "True", "Resolved")
        assert condition(obj, "Degraded")["status"] == "False"
        assert e.resolver.left == 0 and e.resolver.calls == 4  # three 503s, then resolved
        pinned = obj["status"]["resolved"]
        # Someone changes the spec behind the CRD's back (generation 2): refused, pin kept.
        changed = {"spec": {"source": {"huggingFace": {"repository": "org/other"}}}}
        e.fake._update((ARTIFACTS, "team", "f"), changed, None, replace=False)
        obj = await settled(e.fake, "f", "Degraded", "True", "SpecChanged")
        assert obj["status"]["resolved"] == pinned
        assert condition(obj, "Resolved")["status"] == "True"


async def test_revalidation_degrades_then_revokes_and_recovers(tmp_path: Path) -> None:
    """A resolved private artifact checked again against the real (fake) Hub: a rotated token
    degrades it, the same refusal a minute later (here 50 ms) revokes it (Resolved=False, the
    pin kept, the agents' record without digest), the token back makes it whole again; a Hub
    answering 503 only degrades; a deleted Secret revokes at once."""
    async with env(tmp_path) as e:
        e.hub.add("org/private", FILES, token=TOKEN)
        secret = base64.b64encode(TOKEN.encode()).decode()
        e.fake.put_object("api/v1/secrets", {
            "metadata": {"name": "hf", "namespace": "team"}, "data": {"token": secret},
        })  # fmt: skip
        e.fake.put_object(ARTIFACTS, artifact("priv", "org/private",
                                              hf={"secretRef": {"name": "hf"}}))  # fmt: skip
        obj = await settled(e.fake, "priv", "Resolved", "True", "Resolved")
        pinned = obj["status"]["resolved"]
        assert pinned["lastValidatedTime"] == pinned["resolvedTime"]
        reconciler = e.worker.artifacts
        reconciler.recheck_s = 0.05
        due_always = dataclasses.replace(reconciler.inputs, revalidate_s=lambda: 0.0)
        reconciler.inputs = due_always  # due at every reconcile
        key = ("team", "priv")

        e.hub.repos["org/private"].token = "rotated"
        reconciler.add(key)
        await settled(e.fake, "priv", "Degraded", "True", "AccessDenied")
        obj = await settled(e.fake, "priv", "Resolved", "False", "AccessDenied")
        assert obj["status"]["resolved"]["manifestDigest"] == pinned["manifestDigest"]

        async def revoked() -> bool:
            raw = await record_of(e.bus, "priv")
            return raw is not None and b"manifestDigest" not in raw

        await eventually(revoked)

        e.hub.repos["org/private"].token = TOKEN
        await settled(e.fake, "priv", "Resolved", "True", "Resolved")
        obj = await settled(e.fake, "priv", "Degraded", "False", "AsExpected")

        async def restored() -> bool:
            return b"manifestDigest" in (await record_of(e.bus, "priv") or b"")

        await eventually(restored)

        e.resolver.unavailable = 4
        reconciler.add(key)
        await settled(e.fake, "priv", "Degraded", "True", "SourceUnavailable")

        async def outlasted() -> bool:
            return e.resolver.unavailable == 0

        await eventually(outlasted)  # four 503s in a row, one a recheck apart
        obj = await settled(e.fake, "priv", "Degraded", "False", "AsExpected")
        assert condition(obj, "Resolved")["status"] == "True"  # never revoked by a 503

        e.fake.remove("api/v1/secrets", "hf", "team")
        reconciler.add(key)
        await settled(e.fake, "priv", "Resolved", "False", "SecretNotFound")


async def test_an_unreachable_hub_pins_the_expected_digest_for_peers_only(tmp_path: Path) -> None:
    expected = "sha256:" + "e" * 64
    async with env(tmp_path, hub_down=True) as e:
        e.fake.put_object(ARTIFACTS, artifact("anchored", "org/model", expectedDigest=expected))
        e.fake.put_object(ARTIFACTS, artifact("waiting", "org/model"))
        obj = await settled(e.fake, "anchored", "Resolved", "True", "Resolved")
        pinned = obj["status"]["resolved"]
        assert {k: pinned[k] for k in ("manifestDigest", "digestSource")} == {
            "manifestDigest": expected, "digestSource": "Expected",
        }  # fmt: skip
        assert "revision" not in pinned
        assert condition(obj, "Degraded")["status"] == "False"

        async def pushed() -> bool:
            return await record_of(e.bus, "anchored") is not None

        await eventually(pushed)
        raw = await record_of(e.bus, "anchored")
        assert raw is not None
        record = msgspec.json.decode(raw, type=records.ArtifactRecord)
        assert record.manifest_digest == expected and record.revision is None
        assert record.digest_source == "Expected" and record.resolved
        # Without an expectedDigest there is nothing to pin: it keeps waiting for the Hub.
        waiting = await settled(e.fake, "waiting", "Resolved", "False", "SourceUnavailable")
        assert "resolved" not in waiting["status"]
        # An anchor names no commit to list again: revalidation, due at every reconcile, skips
        # it (a check against the unreachable Hub would degrade it).
        reconciler = e.worker.artifacts
        reconciler.inputs = dataclasses.replace(reconciler.inputs, revalidate_s=lambda: 0.0)
        registry = e.worker.metrics.registry
        labels = {"kind": "modelartifact"}

        def reconciles() -> float:
            return registry.get_sample_value("gpustack_worker_reconcile_seconds_count", labels) or 0

        before = reconciles()
        for _ in range(3):
            reconciler.add(("team", "anchored"))

            async def reconciled(seen: float = reconciles()) -> bool:
                return reconciles() > seen

            await eventually(reconciled)
        assert reconciles() >= before + 3
        assert e.resolver.revalidations == 0
        assert condition(e.fake.get(ARTIFACTS, "anchored", "team"), "Degraded")["status"] == "False"

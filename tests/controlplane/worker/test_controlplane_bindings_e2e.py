"""ModelStoreBinding and ModelPrefetch in the running worker: a real nats-server, the fake API,
a real HTTP Hub. What the agents read from the bus is what quota and pins need."""

from __future__ import annotations

import base64
import json
import ssl
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import msgspec
import pytest
from controlplane_fakeapi import node
from test_controlplane_modelartifacts import ARTIFACTS, FILES, artifact, env, record_of, settled

from bus import codec, connection, events, kv, records, subjects
from bus.settings import BusSettings
from bus.testing import eventually
from controlplane.admission import modelrules

pytestmark = pytest.mark.anyio
G = "apis/worker.gpustack.ai/v1alpha1"


async def store_spec(bus: BusSettings, name: str) -> records.StoreSpec | None:
    async with connection.connect(bus, name="reader") as conn:
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
        got = await bucket.get(kv.nms_key(name))
    if got is None:
        return None
    raw = msgspec.json.decode(got[0], type=records.StoreSpecRecord)
    return msgspec.convert(raw.spec, records.StoreSpec)


async def test_the_worker_meters_bindings_and_pins_prefetched_models(tmp_path: Path) -> None:
    async with env(tmp_path, resync_s=0.3) as e:
        e.hub.add("org/public", FILES)
        e.fake.put_object(f"{G}/modelstores", {
            "metadata": {"name": "s1"}, "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}},
        })  # fmt: skip
        for name in ("n1", "n2"):
            body = node(name)
            body["metadata"]["labels"]["pool"] = "a"
            e.fake.put_object("api/v1/nodes", body)
        e.fake.put_object(ARTIFACTS, artifact("pub", "org/public"))
        pub = await settled(e.fake, "pub", "Resolved", "True", "Resolved")
        digest, size = (pub["status"]["resolved"][k] for k in ("manifestDigest", "sizeBytes"))
        e.fake.put_object(f"{G}/modelstorebindings", {
            "metadata": {"name": "b1", "namespace": "team"},
            "spec": {"storeRefs": [{"name": "s1"}], "quota": {"bytes": "10Gi"},
                     "allowPinned": True},
        })  # fmt: skip
        async with connection.connect(e.bus, name="agent") as conn:
            ev = events.ModelsEvent(node="n1", ts=datetime.now(UTC), models=(
                events.ModelState(model=digest, digest=digest, state="ready",
                                  bytes_total=size),))  # fmt: skip
            await conn.publish(subjects.subject("n1", "models"), codec.encode(ev))

        async def metered() -> bool:
            status = e.fake.objects[(f"{G}/modelstorebindings", "team", "b1")].get("status")
            return bool(status) and status["usedBytes"] == size and status["phase"] == "Ready"

        await eventually(metered)
        # The prefetch comes after n1's report is folded: a warm-up Pod made for n1 before would
        # stay until it finished (no kubelet runs it here).
        e.fake.put_object(f"{G}/modelprefetches", {
            "metadata": {"name": "warm", "namespace": "team"},
            "spec": {"artifactRef": {"name": "pub"}, "bindingRef": {"name": "b1"},
                     "retention": {"pinned": True}},
        })  # fmt: skip

        async def quotas_pushed() -> bool:
            raw = await record_of(e.bus, "pub")
            rec = msgspec.json.decode(raw or b"{}", type=records.ArtifactRecord) if raw else None
            return rec is not None and rec.quotas == (
                records.BindingQuota(name="b1", stores=("s1",), quota_bytes=10 << 30,
                                     used_bytes=size),
            ) and rec.size_bytes == size  # fmt: skip

        await eventually(quotas_pushed)

        async def pinned() -> bool:
            spec = await store_spec(e.bus, "n1")
            return spec is not None and spec.store == "s1" and spec.pinned == (digest,)

        await eventually(pinned)  # what the agent on n1 reads: its store and the pin

        async def warming() -> bool:
            pods = [b for (c, _, _), b in e.fake.objects.items() if c == "api/v1/pods"]
            return [(p["spec"]["nodeName"], p["spec"]["containers"][0]["image"]) for p in pods] == [
                ("n2", "gpustack/mirrored-python:3.12-alpine")  # the setting's default
            ]

        await eventually(warming)  # n1 holds it already; n2 gets a warm-up Pod
        mpf = e.fake.objects[(f"{G}/modelprefetches", "team", "warm")]["status"]
        assert (mpf["desiredNodes"], mpf["readyNodes"]) == (2, 1)


async def test_the_worker_serves_and_registers_the_model_rules(tmp_path: Path) -> None:
    """The API server's view: the configuration applied with the worker's CA, and a review
    POSTed over TLS to the Service name it names, verified against that CA, refused."""
    async with env(tmp_path) as e:
        config = e.fake.get(
            "apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            modelrules.NAME,
        )
        (hook,) = config["webhooks"]
        service = hook["clientConfig"]["service"]
        assert service["path"] == modelrules.PATH and hook["failurePolicy"] == "Fail"
        ca = base64.b64decode(hook["clientConfig"]["caBundle"]).decode()
        old = {"metadata": {"name": "b", "namespace": "team"},
               "spec": {"storeRefs": [{"name": "s1"}], "quota": {"bytes": "2Gi"}}}  # fmt: skip
        new = json.loads(json.dumps(old))
        new["spec"]["quota"]["bytes"] = "1Gi"
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u", "operation": "UPDATE", "object": new, "oldObject": old,
                              "resource": {"group": "worker.gpustack.ai", "version": "v1alpha1",
                                           "resource": "modelstorebindings"}}}  # fmt: skip
        port = e.worker.url.rsplit(":", 1)[1]
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"https://127.0.0.1:{port}{modelrules.PATH}",
                data=json.dumps(review).encode(),
                ssl=ssl.create_default_context(cadata=ca),
                server_hostname=f"{service['name']}.{service['namespace']}.svc",
            ) as r,
        ):
            answer = await r.json()
    assert r.status == 200 and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"].startswith(
        "spec.quota.bytes: Forbidden: the quota may only grow"
    )

"""ModelStoreBinding: usage counted per digest x node, phase and conditions written through the
fake Kubernetes API, quotas handed to the artifact records, and the webhook's update rules."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import jsonschema
import msgspec
import pytest
from controlplane_fakeapi import fake_api, node
from test_controlplane_nms_status import strict

from bus import events, records
from controlplane.admission import modelrules
from controlplane.delivery.metering import BindingMeter
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.reconciling import artifacts
from controlplane.reconciling.nodestates import Ledger
from controlplane.schema import crds
from controlplane.stores import bindings

pytestmark = pytest.mark.anyio

G = "apis/worker.gpustack.ai/v1alpha1"
MSB, MS, MART, NODES = (
    f"{G}/modelstorebindings",
    f"{G}/modelstores",
    f"{G}/modelartifacts",
    "api/v1/nodes",
)
D = ["sha256:" + c * 64 for c in "abcd"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
VALIDATOR = jsonschema.Draft7Validator(
    strict(crds.definitions()["modelstorebindings"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]),
)  # fmt: skip


def binding(name: str, *stores: str, quota: Any = None, ns: str = "team-a") -> dict[str, Any]:
    spec: dict[str, Any] = {"storeRefs": [{"name": s} for s in stores]}
    if quota is not None:
        spec["quota"] = {"bytes": quota}
    return {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "ModelStoreBinding",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}  # fmt: skip


def store(name: str, pool: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}}}


def artifact(name: str, digest: str, size: int, ns: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {},
            "status": {"resolved": {"manifestDigest": digest, "sizeBytes": size}}}  # fmt: skip


def pooled(name: str, pool: str) -> dict[str, Any]:
    body = node(name)
    body["metadata"]["labels"]["pool"] = pool
    return body


def models(name: str, *held: tuple[str, str]) -> events.ModelsEvent:
    states = tuple(events.ModelState(model=d, digest=d, state=s) for d, s in held)  # type: ignore[arg-type]
    return events.ModelsEvent(node=name, ts=T0, models=states)


def cluster(fake: Any) -> Ledger:
    """Stores s1 (n1, n2) and s2 (n3); team-a's artifacts: D0 100 B, D1 50 B; team-b's: D2."""
    fake.put_object(MS, store("s1", "a"))
    fake.put_object(MS, store("s2", "b"))
    for name, pool in (("n1", "a"), ("n2", "a"), ("n3", "b")):
        fake.put_object(NODES, pooled(name, pool))
    fake.put_object(MART, artifact("llm", D[0], 100))
    fake.put_object(MART, artifact("small", D[1], 50))
    fake.put_object(MART, artifact("theirs", D[2], 1000, ns="team-b"))
    ledger = Ledger()
    ledger.apply(models("n1", (D[0], "ready"), (D[1], "downloading"), (D[2], "ready")))
    ledger.apply(models("n2", (D[0], "ready"), (D[1], "failed")))
    ledger.apply(models("n3", (D[0], "ready"), (D[1], "ready")))
    return ledger


async def test_usage_counts_each_digest_once_per_node_of_the_bound_stores() -> None:
    """s1: D0 on n1 and n2 (200), D1 downloading on n1 (50), D1 failed on n2 (nothing),
    team-b's D2 not team-a's: 250. s2 adds n3's D0 and D1 (150)."""
    handed: list[str] = []
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        meter = BindingMeter(cluster(fake), on_quotas=handed.append)
        fake.put_object(MSB, binding("fits", "s1", quota="300"))
        fake.put_object(MSB, binding("over", "s1", "s2", quota=300))
        fake.put_object(MSB, binding("broken", "s1", "gone", quota="1Gi"))
        fake.put_object(MSB, binding("free", "s2"))
        await meter.refresh(api)
        objs = {n: fake.get(MSB, n, "team-a") for n in ("fits", "over", "broken", "free")}
        patches = fake.writes["patch"]
        await meter.refresh(api)  # nothing changed: nothing written
        assert fake.writes["patch"] == patches

    for body in objs.values():
        VALIDATOR.validate(body)
    status = {n: body["status"] for n, body in objs.items()}
    assert (status["fits"]["phase"], status["fits"]["usedBytes"]) == ("Ready", 250)
    assert status["fits"]["used"] == "250 B"
    assert (status["over"]["phase"], status["over"]["usedBytes"]) == ("OverQuota", 400)
    assert status["over"]["phaseMessage"] == "400 B used of a 300 B quota"
    over = {c["type"]: (c["status"], c["reason"]) for c in status["over"]["conditions"]}
    assert over == {"OverQuota": ("True", "OverQuota")}
    assert status["broken"]["phase"] == "Error"
    assert status["broken"]["phaseMessage"] == "no ModelStore named gone"
    assert (status["free"]["phase"], status["free"]["usedBytes"]) == ("Ready", 150)
    assert handed == ["team-a"]
    assert meter.quotas("team-a")[1] == records.BindingQuota(
        name="fits", stores=("s1",), quota_bytes=300, used_bytes=250
    )
    assert meter.quotas("team-b") == ()


async def test_a_binding_whose_usage_changes_hands_its_namespace_on_again() -> None:
    handed: list[str] = []
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        ledger = cluster(fake)
        meter = BindingMeter(ledger, on_quotas=handed.append)
        fake.put_object(MSB, binding("fits", "s1", quota="300"))
        await meter.refresh(api)
        ledger.apply(models("n2", (D[0], "ready"), (D[1], "ready")))
        await meter.refresh(api)
        after = fake.get(MSB, "fits", "team-a")["status"]
    assert handed == ["team-a", "team-a"]
    assert after["usedBytes"] == 300 and after["phase"] == "Ready"


def test_the_artifact_record_carries_the_quotas_and_the_size() -> None:
    body = artifact("llm", D[0], 100)
    body["metadata"]["uid"] = "u1"
    body["status"]["resolved"]["revision"] = "c" * 40
    spec = msgspec.convert({"source": {"huggingFace": {"repository": "o/m"}}}, artifacts.Spec)
    quota = records.BindingQuota(name="fits", stores=("s1",), quota_bytes=300, used_bytes=250)
    record = artifacts.record(body, spec, (quota,))
    assert record is not None and record.size_bytes == 100 and record.quotas == (quota,)
    wire = json.loads(msgspec.json.encode(record))
    assert wire["quotas"] == [
        {"name": "fits", "stores": ["s1"], "quotaBytes": 300, "usedBytes": 250}
    ]
    old_reader = msgspec.json.decode(msgspec.json.encode(record), type=records.ArtifactRecord)
    assert old_reader == record


@pytest.mark.parametrize(
    ("raw", "expected"), [("1Gi", 1 << 30), ("1.5k", 1500), (7, 7), ("0.5", 1), (None, None)]
)
def test_quota_quantities(raw: Any, expected: int | None) -> None:
    assert bindings.quota_bytes(binding("b", "s", quota=raw)) == expected


def _review(resource: str, new: dict[str, Any], old: dict[str, Any] | None) -> bytes:
    request: dict[str, Any] = {
        "uid": "r1", "resource": {"group": "worker.gpustack.ai", "version": "v1alpha1",
                                  "resource": resource},
        "operation": "UPDATE" if old is not None else "CREATE", "object": new,
    }  # fmt: skip
    if old is not None:
        request["oldObject"] = old
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def _answer(resource: str, new: dict[str, Any], old: dict[str, Any] | None = None) -> str:
    response = modelrules.decide(_review(resource, new, old))["response"]
    assert response["uid"] == "r1"
    return "" if response["allowed"] else str(response["status"]["message"])


def test_binding_updates_keep_the_stores_and_only_grow() -> None:
    old = binding("b", "s1", quota="100Gi")
    old["spec"]["allowPinned"] = True
    grow = json.loads(json.dumps(old))
    grow["spec"]["quota"]["bytes"] = "200Gi"
    assert _answer("modelstorebindings", grow, old) == ""
    unlimited = json.loads(json.dumps(old))
    del unlimited["spec"]["quota"]
    assert _answer("modelstorebindings", unlimited, old) == ""
    shrink = binding("b", "s1", quota="50Gi")
    shrink["spec"]["allowPinned"] = True
    assert _answer("modelstorebindings", shrink, old) == (
        "spec.quota.bytes: Forbidden: the quota may only grow "
        f"(it was {100 << 30} bytes, this asks for {50 << 30} bytes)"
    )
    moved = binding("b", "s2", quota="100Gi")
    assert _answer("modelstorebindings", moved, old) == (
        "[spec.storeRefs: Forbidden: storeRefs is immutable, "
        "spec.allowPinned: Forbidden: allowPinned may only go from false to true]"
    )
    limited = binding("b", "s1", quota="1")
    assert "may only grow (it was unlimited" in _answer(
        "modelstorebindings", limited, binding("b", "s1")
    )
    pinned = binding("b", "s1")
    pinned["spec"]["allowPinned"] = True
    assert _answer("modelstorebindings", pinned, binding("b", "s1")) == ""  # false -> true
    assert _answer("modelstorebindings", binding("b", "s1", quota="lots")).startswith(
        "spec.quota.bytes: Invalid value: 'lots'"
    )
    deleting = json.loads(json.dumps(moved))
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert _answer("modelstorebindings", deleting, old) == ""


def test_a_review_that_is_no_admission_review_is_refused() -> None:
    with pytest.raises(ValueError, match="not an AdmissionReview"):
        modelrules.decide(b"{}")


def test_the_model_rules_read_reviews_as_every_webhook_of_the_worker_does() -> None:
    """Through the one AdmissionReview reader (``review.request_of``): a review with no uid, an
    object of another kind than the review names, or an object that is no JSON object is the
    caller's mistake (400 at the route), not a decision."""
    body = json.loads(_review("modelstorebindings", binding("b", "s"), None))
    body["request"]["uid"] = ""
    with pytest.raises(ValueError, match="no request with a uid"):
        modelrules.decide(json.dumps(body).encode())
    body = json.loads(_review("modelstorebindings", binding("b", "s"), None))
    body["request"]["kind"] = {"group": "worker.gpustack.ai", "version": "v1alpha1",
                               "kind": "ModelStoreBinding"}  # fmt: skip
    body["request"]["object"] = {"apiVersion": "v1", "kind": "ConfigMap"}
    with pytest.raises(ValueError, match="is a ConfigMap, not the ModelStoreBinding"):
        modelrules.decide(json.dumps(body).encode())
    body["request"]["object"] = ["not", "an", "object"]
    with pytest.raises(ValueError, match="request.object is not an object"):
        modelrules.decide(json.dumps(body).encode())

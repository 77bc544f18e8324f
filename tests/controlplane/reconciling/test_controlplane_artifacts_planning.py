"""ModelArtifact decisions without an event loop: spec, conditions, status, record, backoff."""

from __future__ import annotations

from typing import Any

import msgspec

from bus import events, records
from controlplane.reconciling import artifacts
from controlplane.reconciling.artifacts import Failure, Spec
from controlplane.reconciling.hubresolver import Resolved

DIGEST = "sha256:" + "a" * 64


def body(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "m", "namespace": "team", "uid": "u-1", "generation": 1},
        "spec": {"source": {"huggingFace": {"repository": "org/m", **spec.pop("hf", {})}}} | spec,
    }


def test_spec_defaults_and_refusals() -> None:
    spec = artifacts.parse_spec(body())
    assert isinstance(spec, Spec) and spec.source.hugging_face.revision == "main"
    bad = artifacts.parse_spec({"spec": {"source": {}}})
    assert isinstance(bad, Failure) and bad.reason == "InvalidSpec" and "no source" in bad.message
    empty = artifacts.parse_spec(body(hf={"repository": ""}))
    assert isinstance(empty, Failure) and "repository" in empty.message
    assert not artifacts.spec_changed(body())
    assert artifacts.spec_changed({"metadata": {"generation": 2}})


def test_conditions_keep_transition_times_while_unchanged() -> None:
    first = artifacts.conditions([], False, None, "t1")
    assert [(c["type"], c["status"], c["reason"]) for c in first] == [
        ("Resolved", "False", "Resolving"),
        ("Degraded", "False", "AsExpected"),
    ]
    temporary = Failure(reason="SourceUnavailable", message="503", temporary=True)
    second = artifacts.conditions(first, False, temporary, "t2")
    assert second[0]["reason"] == "SourceUnavailable" and second[0]["lastTransitionTime"] == "t1"
    assert second[1]["status"] == "False"  # temporary: not degraded
    denied = Failure(reason="AccessDenied", message="401")
    third = artifacts.conditions(second, False, denied, "t3")
    assert third[1] == {
        "type": "Degraded", "status": "True", "reason": "AccessDenied", "message": "401",
        "lastTransitionTime": "t3",
    }  # fmt: skip
    assert artifacts.conditions(third, True, None, "t4")[0]["lastTransitionTime"] == "t4"


def test_status_pins_once_and_counts_nodes() -> None:
    resolved = Resolved(commit="c" * 40, digest=DIGEST, file_count=3, size_bytes=10)
    counts = {"ready": 1, "downloading": 0, "failed": 0}
    st = artifacts.status(body(), resolved=resolved, failure=None, counts=counts, now="t")
    assert st["resolved"] == {
        "revision": "c" * 40, "manifestDigest": DIGEST, "digestSource": "Hub", "fileCount": 3,
        "sizeBytes": 10, "resolvedTime": "t", "lastValidatedTime": "t",
    }  # fmt: skip
    assert st["observedGeneration"] == 1 and st["nodes"] == counts
    again = artifacts.status(body() | {"status": st}, resolved=None, failure=None, counts=counts,
                             now="later")  # fmt: skip
    assert again == st  # nothing changed: no write


def test_node_counts_one_state_per_node() -> None:
    def m(model: str, state: Any) -> events.ModelState:
        return events.ModelState(model=model, state=state)

    caches = [
        (m(DIGEST, "ready"),),
        (m(DIGEST, "downloading"), m("sha256:" + "b" * 64, "ready")),
        (m(DIGEST, "evicting"),),
        (m(DIGEST, "failed"),),
        None,
    ]
    assert artifacts.node_counts(caches, DIGEST) == {"ready": 2, "downloading": 1, "failed": 1}


def test_record_names_the_secret_never_the_token() -> None:
    b = body(hf={"secretRef": {"name": "hf"}}, allowPatterns=["*.json"])
    b["status"] = {"resolved": {"revision": "c" * 40, "manifestDigest": DIGEST}}
    spec = artifacts.parse_spec(b)
    assert isinstance(spec, Spec)
    rec = artifacts.record(b, spec)
    assert rec == records.ArtifactRecord(
        namespace="team", name="m", uid="u-1",
        source=records.HuggingFaceSource(repository="org/m"),
        manifest_digest=DIGEST, revision="c" * 40,
        token_secret=records.SecretRef(namespace="team", name="hf"),
        allow_patterns=("*.json",),
    )  # fmt: skip
    wire = msgspec.json.decode(msgspec.json.encode(rec))
    assert wire["tokenSecret"] == {"namespace": "team", "name": "hf"}
    assert artifacts.record(b, None) is None


def test_backoff_grows_while_temporary_and_caps_otherwise() -> None:
    temporary = Failure(reason="SourceUnavailable", message="", temporary=True)
    delays = [artifacts.backoff_s(n, temporary, base_s=1, cap_s=60) for n in range(8)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]
    permanent = Failure(reason="AccessDenied", message="")
    assert artifacts.backoff_s(0, permanent, base_s=1, cap_s=60) == 60


def test_a_revoked_artifact_keeps_its_pin_and_loses_its_record_digest() -> None:
    """A revalidation that revoked the artifact: Resolved=False with the pin kept, Degraded
    with the refusal, and the agents' record without digest or commit (no new mount)."""
    b = body()
    b["status"] = {"resolved": {"revision": "c" * 40, "manifestDigest": DIGEST,
                                "lastValidatedTime": "t0"}}  # fmt: skip
    denied = Failure(reason="AccessDenied", message="403")
    counts = {"ready": 0, "downloading": 0, "failed": 0}
    st = artifacts.status(b, resolved=None, failure=denied, counts=counts, now="t1", revoked=True)
    assert st["resolved"]["manifestDigest"] == DIGEST
    assert [(c["type"], c["status"], c["reason"]) for c in st["conditions"]] == [
        ("Resolved", "False", "AccessDenied"), ("Degraded", "True", "AccessDenied"),
    ]  # fmt: skip
    spec = artifacts.parse_spec(b)
    assert isinstance(spec, Spec)
    rec = artifacts.record(b | {"status": st}, spec)
    assert rec is not None and not rec.resolved and rec.manifest_digest is None
    passed = artifacts.status(b | {"status": st}, resolved=None, failure=None, counts=counts,
                              now="t2", passed=True)  # fmt: skip
    assert passed["resolved"]["lastValidatedTime"] == "t2"
    assert passed["conditions"][0]["status"] == "True"


def test_only_an_unreachable_hub_twice_anchors_an_expected_digest() -> None:
    spec = artifacts.Spec(
        source=artifacts.Source(hugging_face=artifacts.HuggingFace(repository="org/m")),
        expected_digest=DIGEST,
    )
    down = Failure(reason="SourceUnavailable", message="refused", temporary=True)
    assert not artifacts.anchors(spec, down, 1)
    assert artifacts.anchors(spec, down, artifacts.ANCHOR_AFTER)
    refused = Failure(reason="AccessDenied", message="401")
    assert not artifacts.anchors(spec, refused, 5)  # the Hub answered: no anchor
    without = msgspec.structs.replace(spec, expected_digest=None)
    assert not artifacts.anchors(without, down, 5)
    st = artifacts.status(body(), resolved=Resolved.anchored(DIGEST), failure=None,
                          counts={"ready": 0, "downloading": 0, "failed": 0}, now="t")  # fmt: skip
    assert st["resolved"] == {"manifestDigest": DIGEST, "digestSource": "Expected",
                              "resolvedTime": "t", "lastValidatedTime": "t"}  # fmt: skip
    rec = artifacts.record(body() | {"status": st}, spec)
    assert rec is not None and rec.resolved and rec.revision is None

"""The AGENTS bucket's records are a public contract: one control plane and many agents of
different versions read each other's JSON. The merged :class:`bus.records.ArtifactRecord` keeps
the wire format ``bus.kv.ArtifactRecord`` had, byte for byte."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from bus import records

DIGEST = "sha256:" + "a" * 64
COMMIT = "c" * 40


class _OldRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    pass


class OldSecretRef(_OldRecord, frozen=True, kw_only=True):
    namespace: str
    name: str
    key: str = "token"


class OldHuggingFaceSource(_OldRecord, frozen=True, kw_only=True):
    repository: str
    revision: str = "main"


class OldArtifactRecord(_OldRecord, frozen=True, kw_only=True):
    """A copy of ``bus.kv.ArtifactRecord`` as control planes and agents before the merge had it."""

    namespace: str
    name: str
    uid: str
    source: OldHuggingFaceSource
    manifest_digest: str | None = None
    revision: str | None = None
    token_secret: OldSecretRef | None = None
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()


# Written by the old control plane (``msgspec.json.encode(kv.ArtifactRecord(...))``).
OLD_RESOLVED = (
    b'{"namespace":"team","name":"llm","uid":"u-1",'
    b'"source":{"repository":"org/model","revision":"v2"},'
    b'"manifestDigest":"' + DIGEST.encode() + b'","revision":"' + COMMIT.encode() + b'",'
    b'"tokenSecret":{"namespace":"team","name":"hf","key":"hf-token"},'
    b'"allowPatterns":["*.json","*.safetensors"],"ignorePatterns":["*.md"]}'
)
OLD_UNRESOLVED = (
    b'{"namespace":"team","name":"llm","uid":"u-1","source":{"repository":"org/model"}}'
)


def test_an_old_resolved_record_decodes_into_the_merged_one() -> None:
    rec = msgspec.json.decode(OLD_RESOLVED, type=records.ArtifactRecord)

    assert rec == records.ArtifactRecord(
        namespace="team",
        name="llm",
        uid="u-1",
        source=records.HuggingFaceSource(repository="org/model", revision="v2"),
        manifest_digest=DIGEST,
        revision=COMMIT,
        token_secret=records.SecretRef(namespace="team", name="hf", key="hf-token"),
        allow_patterns=("*.json", "*.safetensors"),
        ignore_patterns=("*.md",),
    )
    assert rec.resolved


def test_an_old_unresolved_record_decodes_with_the_old_defaults() -> None:
    rec = msgspec.json.decode(OLD_UNRESOLVED, type=records.ArtifactRecord)

    assert rec.source.revision == "main"
    assert (rec.manifest_digest, rec.revision, rec.token_secret) == (None, None, None)
    assert (rec.allow_patterns, rec.ignore_patterns) == ((), ())
    assert not rec.resolved


@pytest.mark.parametrize("wire", [OLD_RESOLVED, OLD_UNRESOLVED])
def test_the_merged_record_writes_what_the_old_one_wrote(wire: bytes) -> None:
    rec = msgspec.json.decode(wire, type=records.ArtifactRecord)

    assert msgspec.json.encode(rec) == wire


@pytest.mark.parametrize("wire", [OLD_RESOLVED, OLD_UNRESOLVED])
def test_an_old_reader_decodes_what_the_merged_record_writes(wire: bytes) -> None:
    new = msgspec.json.encode(msgspec.json.decode(wire, type=records.ArtifactRecord))

    old = msgspec.json.decode(new, type=OldArtifactRecord)

    assert msgspec.json.encode(old) == wire
    assert msgspec.to_builtins(old) == msgspec.to_builtins(
        msgspec.json.decode(wire, type=records.ArtifactRecord)
    )


def test_a_newer_writers_unknown_fields_are_ignored() -> None:
    wire = OLD_UNRESOLVED[:-1] + b',"futureField":{"x":1}}'

    rec = msgspec.json.decode(wire, type=records.ArtifactRecord)

    assert rec == msgspec.json.decode(OLD_UNRESOLVED, type=records.ArtifactRecord)


def test_resolved_needs_both_the_digest_and_the_commit() -> None:
    base = msgspec.json.decode(OLD_UNRESOLVED, type=records.ArtifactRecord)

    digest_only = msgspec.structs.replace(base, manifest_digest=DIGEST)
    commit_only = msgspec.structs.replace(base, revision=COMMIT)
    both = msgspec.structs.replace(base, manifest_digest=DIGEST, revision=COMMIT)

    assert (digest_only.resolved, commit_only.resolved, both.resolved) == (False, False, True)
    assert b"resolved" not in msgspec.json.encode(both)  # derived, never on the wire


def test_store_spec_record_keeps_its_wire_format() -> None:
    wire = (
        b'{"node":"n1","spec":{"download":{"concurrency":4},"pinned":["' + DIGEST.encode() + b'"]}}'
    )

    rec = msgspec.json.decode(wire, type=records.StoreSpecRecord)
    spec = msgspec.convert(rec.spec, records.StoreSpec)

    assert msgspec.json.encode(rec) == wire
    assert spec.download.concurrency == 4 and spec.pinned == (DIGEST,)
    assert spec.problems() == []


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (DIGEST, True),
        ("sha256:" + "A" * 64, False),
        ("sha256:" + "a" * 63, False),
        ("sha512:" + "a" * 64, False),
        (DIGEST + "\n", False),
    ],
)
def test_is_digest(value: str, ok: bool) -> None:
    assert records.is_digest(value) is ok


def test_a_pending_request_is_camel_case_and_omits_what_the_container_did_not_ask() -> None:
    when = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    rec = records.PendingContainers(
        node="gpu-a",
        containers=(
            records.PendingContainer(
                pod_uid="u1", namespace="ns", pod="p", container="main",
                resource="nvidia.com/gpu.sliced", units=400_000, memory_percentage=25,
                cores_percentage=50, created_at=when,
            ),
        ),
    )  # fmt: skip
    wire = msgspec.json.decode(msgspec.json.encode(rec))
    assert wire == {
        "node": "gpu-a",
        "containers": [
            {
                "podUid": "u1", "namespace": "ns", "pod": "p", "container": "main",
                "resource": "nvidia.com/gpu.sliced", "units": 400000, "memoryPercentage": 25,
                "coresPercentage": 50, "createdAt": "2025-01-02T03:04:05Z",
            }
        ],
    }  # fmt: skip
    newer = msgspec.json.encode({**wire, "future": 1})
    assert msgspec.json.decode(newer, type=records.PendingContainers) == rec


def test_quotas_and_size_are_optional_within_v1() -> None:
    """Added for ModelStoreBinding quotas: an old agent reads a record carrying them (and
    enforces none); a new agent reads an old record as one without quotas."""
    old_wire = OLD_RESOLVED
    quota = records.BindingQuota(name="q", stores=("s1",), quota_bytes=10, used_bytes=4)
    rec = msgspec.structs.replace(
        msgspec.json.decode(old_wire, type=records.ArtifactRecord), size_bytes=7, quotas=(quota,)
    )
    new_wire = msgspec.json.encode(rec)

    assert msgspec.json.encode(msgspec.json.decode(new_wire, type=OldArtifactRecord)) == old_wire
    assert msgspec.json.decode(new_wire, type=records.ArtifactRecord) == rec
    assert b'"quotas":[{"name":"q","stores":["s1"],"quotaBytes":10,"usedBytes":4}]' in new_wire
    plain = msgspec.json.decode(old_wire, type=records.ArtifactRecord)
    assert (plain.size_bytes, plain.quotas) == (None, ())
    spec = msgspec.convert({"store": "s1"}, records.StoreSpec)
    assert spec.store == "s1" and spec.problems() == []

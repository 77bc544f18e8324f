"""Which failure holds back which request: backoff per digest, source and credential."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import grpc
import msgspec
import pytest
from models_harness import (
    FILES,
    Rig,
    code_of,
    publish_request,
    publish_until_done,
    settled,
    unpublish,
)

from agent.models import backoff, mounting
from agent.models.errors import Materializing
from agent.models.jobs import Source
from agent.models.layout import DigestRecord
from bus.records import ArtifactRecord

pytestmark = pytest.mark.anyio
A = backoff.source_key("org/m", "c" * 40, None)
B = backoff.source_key("org/m", "c" * 40, "hf_team_b")


def _failed(
    record: DigestRecord, key: str, reason: str, now: float, *, permanent: bool = False
) -> DigestRecord:
    failure = backoff.Failure(reason, "why", permanent)
    return backoff.failed(record, {key: failure}, now=now, first_s=60, max_s=3600)


def test_a_backoff_holds_back_only_its_own_source_and_credential() -> None:
    record = _failed(DigestRecord(), A, "AccessDenied", 1000)

    assert backoff.blocking(record, A, 1059) is not None
    assert backoff.blocking(record, A, 1060) is None
    assert backoff.blocking(record, B, 1001) is None
    assert backoff.blocking(record, A.replace("c" * 40, "d" * 40), 1001) is None
    assert (record.reason, record.retry_at) == ("AccessDenied", 1060)  # what the node reports


def test_a_failure_of_the_node_holds_back_every_source() -> None:
    record = _failed(DigestRecord(), backoff.ANY, "InsufficientCapacity", 1000)

    held = backoff.blocking(record, B, 1001)

    assert held is not None and held.reason == "InsufficientCapacity"


def test_each_key_doubles_on_its_own_and_old_ones_are_forgotten() -> None:
    record = _failed(DigestRecord(), A, "SourceUnavailable", 0)
    record = _failed(record, A, "SourceUnavailable", 100)
    record = _failed(record, B, "SourceUnavailable", 100)
    doubled, fresh = record.backoffs[A], record.backoffs[B]
    later = _failed(record, B, "SourceUnavailable", 100 + 120 + 3600)

    assert (doubled.failures, doubled.retry_at) == (2, 220)
    assert (fresh.failures, fresh.retry_at) == (1, 160)
    assert list(later.backoffs) == [B]


def test_a_permanent_failure_waits_the_longest_and_is_a_terminal_answer() -> None:
    record = _failed(DigestRecord(), A, "InvalidRequest", 1000, permanent=True)
    held = backoff.blocking(record, A, 1001)
    assert held is not None

    answer = backoff.refusal("ab" * 32, held)

    assert held.retry_at == 1000 + 3600
    assert (answer.code, answer.reason) == ("FAILED_PRECONDITION", "InvalidRequest")
    assert "cannot succeed" in str(answer)


def test_no_backoff_reasons_are_reported_but_hold_nobody_back() -> None:
    record = _failed(DigestRecord(), A, "Canceled", 1000)

    assert record.reason == "Canceled" and record.retry_at is None
    assert backoff.blocking(record, A, 1001) is None


def test_a_credential_is_named_without_its_token() -> None:
    named = backoff.credential_id("hf_secret_value")

    assert "hf_secret_value" not in named and "secret" not in named
    assert named == backoff.credential_id("hf_secret_value") != backoff.credential_id("hf_other")
    assert backoff.credential_id(None) == backoff.credential_id("") == "anonymous"
    assert "hf_team_b" not in B
    assert "hf_secret_value" not in repr(Source("org/m", "c" * 40, "hf_secret_value"))


@pytest.mark.usefixtures("mounts")
async def test_a_tokenless_denial_does_not_hold_back_an_authorised_mount(rig: Rig) -> None:
    team_a = rig.artifact("org/private", FILES, token="right")
    team_b = msgspec.structs.replace(team_a, namespace="team-b", uid=str(uuid.uuid4()))
    rig.policy.put(team_b)  # the same model: same repository, commit and digest
    a, b = rig.target(pod="pod-a"), rig.target(pod="pod-b")

    async with rig.running() as plugin:
        first, _ = await code_of(plugin.socket, publish_request(team_a, a, volume_id="csi-a"))
        await settled(plugin)
        again, denied = await code_of(plugin.socket, publish_request(team_a, a, volume_id="csi-a"))
        request_b = publish_request(team_b, b, volume_id="csi-b", token="right")
        b_first, b_message = await code_of(plugin.socket, request_b)
        await publish_until_done(plugin.socket, request_b)
        mounted = mounting.is_mount_point(b)
        await unpublish(plugin.socket, "csi-b", b)

    assert first == grpc.StatusCode.ABORTED
    assert again == grpc.StatusCode.UNAVAILABLE and "AccessDenied" in denied
    assert b_first == grpc.StatusCode.ABORTED, b_message  # its own attempt, not a's backoff
    assert mounted is not None and mounted.read_only


async def test_a_denied_credential_keeps_its_backoff_across_a_restart(rig: Rig) -> None:
    record = rig.artifact("org/private", FILES, token="right")
    target = rig.target()

    async with rig.running() as plugin:
        await code_of(plugin.socket, publish_request(record, target, token="wrong-token"))
        await settled(plugin)
    async with rig.running() as plugin:
        code, message = await code_of(
            plugin.socket, publish_request(record, target, token="wrong-token")
        )
        other, _ = await code_of(plugin.socket, publish_request(record, target, token="right"))
        await settled(plugin)

    assert code == grpc.StatusCode.UNAVAILABLE
    assert "AccessDenied" in message
    assert other == grpc.StatusCode.ABORTED
    ledger = b"".join(p.read_bytes() for p in (rig.settings.cache_root / "ledger").rglob("*.json"))
    assert b"wrong-token" not in ledger and b"right" not in ledger


async def test_a_refused_source_is_passed_over_for_one_that_joined(rig: Rig) -> None:
    record = rig.artifact("org/private", FILES, token="right")
    hex_ = (record.manifest_digest or "")[7:]
    commit = record.revision or ""

    async with rig.running() as plugin:
        for token in (None, "right"):  # both ask before the job lists anything
            with pytest.raises(Materializing):
                plugin.materializer.ensure(hex_, Source("org/private", commit, token))
        await settled(plugin)
        published = plugin.cache.is_published(hex_)
        ledger = plugin.cache.load_digest(hex_)

    assert published
    assert (ledger.reason, ledger.backoffs) == (None, {})
    denied = [s for s in rig.hub.seen if "/tree/" in s.path and s.authorization is None]
    assert denied  # the tokenless source was tried first, and refused


def _extra(*entries: dict[str, object]) -> Callable[[Rig, ArtifactRecord], ArtifactRecord]:
    def apply(rig: Rig, record: ArtifactRecord) -> ArtifactRecord:
        rig.hub.repos[record.source.repository].extra_entries = list(entries)
        return record

    return apply


def _other_digest(rig: Rig, record: ArtifactRecord) -> ArtifactRecord:
    other = msgspec.structs.replace(record, manifest_digest="sha256:" + "0" * 64)
    rig.policy.put(other)
    return other


LISTING_FAULTS = {
    "a path leaving the tree": _extra({"type": "file", "path": "../x", "oid": "0" * 40}),
    "a duplicate path": _extra({"type": "file", "path": "empty.txt", "oid": "0" * 40}),
    "LFS and file sizes disagree": _extra(
        {"type": "file", "path": "w.bin", "size": 5, "lfs": {"oid": "a" * 64, "size": 6}}
    ),
    "the listing is another digest": _other_digest,
    "a malformed page": _extra({"type": "file"}),
}


@pytest.mark.parametrize(
    ("fault", "code", "reason"),
    [
        ("a path leaving the tree", grpc.StatusCode.FAILED_PRECONDITION, "InvalidRequest"),
        ("a duplicate path", grpc.StatusCode.FAILED_PRECONDITION, "InvalidRequest"),
        ("LFS and file sizes disagree", grpc.StatusCode.FAILED_PRECONDITION, "IntegrityMismatch"),
        ("the listing is another digest", grpc.StatusCode.FAILED_PRECONDITION, "IntegrityMismatch"),
        ("a malformed page", grpc.StatusCode.UNAVAILABLE, "SourceUnavailable"),  # may heal
    ],
)
async def test_a_listing_that_cannot_change_is_a_terminal_answer(
    rig: Rig, fault: str, code: grpc.StatusCode, reason: str
) -> None:
    record = LISTING_FAULTS[fault](rig, rig.artifact("org/bad", FILES))
    target = rig.target()

    async with rig.running() as plugin:
        first, _ = await code_of(plugin.socket, publish_request(record, target))
        await settled(plugin)
        second, message = await code_of(plugin.socket, publish_request(record, target))
        third, _ = await code_of(plugin.socket, publish_request(record, target))

    assert first == grpc.StatusCode.ABORTED
    assert (second, third) == (code, code), message
    assert reason in message
    assert list((rig.settings.cache_root / "published").iterdir()) == []

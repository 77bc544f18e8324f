"""Failure backoff of materializations, per digest, source and credential; pure.

A failure belongs to what got it: the repository, the commit and the credential that were used.
Team A's tokenless request being refused (AccessDenied) says nothing about team B's token for
the same model, so a backoff only holds back requests with the same :func:`source_key`. The
key never holds a token: a credential is named by a truncated SHA-256 of it (``anonymous``
without one), which is what the ledger, logs and memory keys see. A failure of the node itself
(a full cache, cache I/O) has the key :data:`ANY`: it holds back every request of the digest.

A *permanent* failure (the pinned commit's listing is invalid or is another digest: it lists
the same files every time) is answered FAILED_PRECONDITION rather than "retry later", and is
checked again only after the longest backoff, in case the cause was on this side.

What the node *reports* for a digest (``reason``, ``message``, ``retry_at`` of its
:class:`~agent.models.layout.DigestRecord`) stays the latest failure, by digest only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NamedTuple

import msgspec

from agent.models.errors import BackingOff, NoSpace
from agent.models.layout import Backoff, DigestRecord
from hub.errors import HubError
from kit import backoff as kit_backoff

__all__ = [
    "ANY",
    "NO_BACKOFF",
    "Failure",
    "Permanent",
    "backoff_delay",
    "blocking",
    "credential_id",
    "failed",
    "failure_of",
    "refusal",
    "source_key",
    "succeeded",
]

NO_BACKOFF = frozenset({"Canceled"})
"""Reasons that do not hold back the next attempt."""
ANY = "*"
"""The key of a failure that is the node's, not a source's: it holds back every request."""


class Failure(NamedTuple):
    """How one source (or the node) failed an attempt."""

    reason: str
    message: str
    permanent: bool = False


class Permanent(Exception):
    """A Hub error the same source will always give: its pinned commit lists what it lists."""

    def __init__(self, error: HubError) -> None:
        super().__init__(str(error))
        self.error = error


def failure_of(source: str, e: Permanent | HubError | NoSpace | OSError) -> tuple[str, Failure]:
    """The key and failure an attempt's error is recorded as.

    A Hub error is the failure of ``source``, the key of the source being tried; the others are
    the node's (key :data:`ANY`: they hold back every request).
    """
    if isinstance(e, Permanent):
        return source, Failure(e.error.reason, str(e.error), permanent=True)
    if isinstance(e, HubError):
        return source, Failure(e.reason, str(e))
    if isinstance(e, NoSpace):
        return ANY, Failure("InsufficientCapacity", str(e))
    return ANY, Failure("SourceUnavailable", f"cache I/O failed: {e}")


def credential_id(token: str | None) -> str:
    """A name for ``token`` that cannot give it back: ``anonymous`` or 16 hex of its SHA-256."""
    if not token:
        return "anonymous"
    digest = hashlib.sha256(b"gpustack-model-credential\0" + token.encode()).hexdigest()
    return "sha256-" + digest[:16]


def source_key(repository: str, commit: str, token: str | None) -> str:
    """``<repository>@<commit>#<credential>``: what one backoff holds back."""
    return f"{repository}@{commit}#{credential_id(token)}"


def backoff_delay(failures: int, *, first_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures: first_s, doubling, capped
    (:func:`kit.backoff.delay`; not jittered: the delay is recorded and reported as is)."""
    return kit_backoff.delay(failures, first_s=first_s, max_s=max_s)


def blocking(record: DigestRecord, key: str, now: float) -> Backoff | None:
    """The backoff that holds back a request of ``key`` at ``now`` (its own or :data:`ANY`)."""
    found = [b for k in (key, ANY) if (b := record.backoffs.get(k)) and b.retry_at > now]
    return max(found, key=lambda b: b.retry_at, default=None)


def refusal(hex_: str, backoff: Backoff) -> BackingOff:
    """The answer to a request held back by ``backoff`` (reason and when it retries)."""
    when = datetime.fromtimestamp(backoff.retry_at, UTC).isoformat(timespec="seconds")
    if backoff.permanent:
        return BackingOff.of(
            f"materializing sha256:{hex_[:12]} cannot succeed from this source, "
            f"{backoff.reason}: {backoff.message}; the pinned commit lists the same files every "
            f"time (checked again at {when})",
            reason=backoff.reason,
            permanent=True,
        )
    return BackingOff.of(
        f"materializing sha256:{hex_[:12]} failed, {backoff.reason}: {backoff.message}; "
        f"the next attempt starts at {when}",
        reason=backoff.reason,
    )


def succeeded(record: DigestRecord, now: float) -> DigestRecord:
    """``record`` once the tree is published: no failure holds anyone back any more."""
    return msgspec.structs.replace(
        record, failures=0, reason=None, message=None, retry_at=None, last_used=now, backoffs={}
    )


def failed(
    record: DigestRecord,
    tried: Mapping[str, Failure],
    *,
    now: float,
    first_s: float,
    max_s: float,
) -> DigestRecord:
    """``record`` after an attempt whose sources failed: ``tried`` maps key -> failure.

    Each key backs off on its own count (first_s, doubling to max_s; a permanent failure at once
    max_s); one quiet for longer than ``max_s`` after its retry time is forgotten, so the ledger
    does not grow with old tokens. The last failure in ``tried`` is what the node reports.
    """
    backoffs = {k: b for k, b in record.backoffs.items() if b.retry_at + max_s > now}
    reason = message = None
    retry_at: float | None = None
    failures = record.failures
    for key, (reason, message, permanent) in tried.items():
        retry_at = None
        if reason in NO_BACKOFF:
            continue
        before = backoffs.get(key)
        failures = (before.failures if before is not None else 0) + 1
        delay = max_s if permanent else backoff_delay(failures, first_s=first_s, max_s=max_s)
        retry_at = now + delay
        backoffs[key] = Backoff(
            reason=reason,
            message=message[:512],
            failures=failures,
            retry_at=retry_at,
            permanent=permanent,
        )
    return msgspec.structs.replace(
        record,
        failures=failures,
        reason=reason,
        message=message[:512] if message is not None else None,
        retry_at=retry_at,
        backoffs=backoffs,
    )

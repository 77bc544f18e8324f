"""ModelArtifact revalidation decisions, pure: when a resolved artifact is checked again, and what
the check's outcome does to its conditions.

A resolved artifact pins a commit and a digest for ever, but the Hub may stop serving them: a
token revoked, a repository gated or deleted, a commit force-pushed away. Every
``model-artifact-revalidate-interval`` (default 24 h; ``status.resolved.lastValidatedTime``
says when it last passed) the worker lists the commit again and reads the first byte of its
first file with the artifact's token (:meth:`controlplane.reconciling.hubresolver.Resolver.revalidate`):

=====================  ===================================================================
outcome                effect
=====================  ===================================================================
passes                 ``lastValidatedTime`` moves; Degraded=False; a revoked artifact is
                       Resolved=True again
SourceUnavailable      Degraded=True only (the Hub could not answer: it says nothing about
                       the artifact); checked again every :data:`RECHECK_S`
a refusal (first)      Degraded=True with the reason; checked again after :data:`RECHECK_S`
the same refusal       Resolved=False (*revoked*): the agents' record loses its digest, so no
again                  new volume mounts it (running Pods keep theirs)
SecretNotFound         Resolved=False at once: the credential is gone, nothing to wait for
=====================  ===================================================================

A revoked artifact keeps ``status.resolved`` (the pin does not change) and is checked again at
the retry cap until it passes. Strikes live in the leader's memory; a new leader reads a
revoked artifact from its conditions and checks it at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

import msgspec

from controlplane.reconciling.artifacts import Failure

__all__ = ["RECHECK_S", "Outcome", "due", "judge", "revoked"]

RECHECK_S: Final = 60.0
"""After a failed check, the next one comes this much later (the reference's minute)."""


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the last check means for the artifact."""

    failure: Failure | None = None
    """Degrades the artifact (always non-temporary here: Degraded=True)."""
    revoked: bool = False
    """Resolved=False: no new mount."""
    passed: bool = False
    """The check passed now: ``lastValidatedTime`` moves."""
    strike: str | None = None
    """The refusal a second, equal one would revoke on."""


def revoked(conditions: Iterable[Mapping[str, Any]], pinned: Mapping[str, Any]) -> bool:
    """Pinned, yet Resolved=False: an earlier check revoked it."""
    return bool(pinned) and any(
        c.get("type") == "Resolved" and c.get("status") == "False" for c in conditions
    )


def due(pinned: Mapping[str, Any], now: datetime, interval_s: float) -> bool:
    """The last pass (or the resolution) is ``interval_s`` old, or unknown."""
    stamp = pinned.get("lastValidatedTime") or pinned.get("resolvedTime")
    if not isinstance(stamp, str):
        return True
    try:
        last = datetime.fromisoformat(stamp)
    except ValueError:
        return True
    return (now - last).total_seconds() >= interval_s


def judge(strike: str | None, failure: Failure | None) -> Outcome:
    """The outcome of one check, given the refusal the previous one struck (if any)."""
    if failure is None:
        return Outcome(passed=True)
    degrading = msgspec.structs.replace(failure, temporary=False)
    if failure.temporary:
        return Outcome(failure=degrading, strike=strike)
    if failure.reason == "SecretNotFound" or strike == failure.reason:
        return Outcome(failure=degrading, revoked=True, strike=failure.reason)
    return Outcome(failure=degrading, strike=failure.reason)

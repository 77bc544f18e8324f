"""Errors of the Hub client, each carrying the status ``reason`` the rest of the system reports.

The reasons are the NodeModelStore/ModelArtifact vocabulary (``RevisionNotFound``,
``AccessDenied``, ``SourceUnavailable``, ``IntegrityMismatch``, ``InvalidRequest``), so a caller
maps an error to a status without string matching. Transport errors (:class:`hub.http.HttpError`)
never leave this package.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AccessDenied",
    "HubError",
    "IntegrityMismatch",
    "InvalidManifest",
    "RevisionNotFound",
    "SourceUnavailable",
]


class HubError(Exception):
    """Base of every Hub failure; ``reason`` is the status reason it maps to."""

    reason: ClassVar[str] = "SourceUnavailable"


class RevisionNotFound(HubError):
    """The repository exists (or may) but has no such revision."""

    reason = "RevisionNotFound"


class AccessDenied(HubError):
    """401, 403, a gated repository or a 404 other than an unknown revision: the token decides."""

    reason = "AccessDenied"


class SourceUnavailable(HubError):
    """The Hub could not answer now (5xx, 429, network, timeout): retry later."""

    reason = "SourceUnavailable"


class InvalidManifest(HubError):
    """The file listing cannot be turned into a manifest (bad path, duplicate, bad oid)."""

    reason = "InvalidRequest"


class IntegrityMismatch(HubError):
    """Bytes or listings disagree with the digest or the manifest: never publish them."""

    reason = "IntegrityMismatch"

"""Errors of the model plugin, one per answer a CSI caller must get.

Each class carries the gRPC status it maps to (``code``, a :class:`grpclib.const.Status` name) so
the server maps by type, never by message. Messages are for people (kubelet shows them in Pod
events) and never carry a secret.
"""

from __future__ import annotations

from typing import ClassVar

from agent.errors import AgentError

__all__ = [
    "AlreadyPublished",
    "BackingOff",
    "CacheCorrupt",
    "Denied",
    "InvalidVolume",
    "Materializing",
    "ModelsError",
    "MountFailed",
    "NoSpace",
    "NotReady",
    "PermanentFailure",
    "QuotaExceeded",
]


class ModelsError(AgentError):
    code: ClassVar[str] = "INTERNAL"


class InvalidVolume(ModelsError):
    """Malformed request: bad target, missing attribute, not an inline ephemeral volume."""

    code = "INVALID_ARGUMENT"


class Denied(ModelsError):
    """The Pod's namespace may not mount this volume; the message names the failed rule."""

    code = "PERMISSION_DENIED"


class NotReady(ModelsError):
    """The plugin cannot decide yet (no policy synced, references not rebuilt); kubelet retries."""

    code = "UNAVAILABLE"


class Materializing(ModelsError):
    """The model is being downloaded; the message carries the progress; kubelet retries."""

    code = "ABORTED"


class BackingOff(ModelsError):
    """The last attempt failed and the next one is not due yet."""

    code = "UNAVAILABLE"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason

    @staticmethod
    def of(message: str, *, reason: str, permanent: bool = False) -> BackingOff:
        """The right class: capacity failures are RESOURCE_EXHAUSTED, permanent ones
        FAILED_PRECONDITION."""
        cls: type[BackingOff] = BackingOff
        if permanent:
            cls = PermanentFailure
        elif reason == "InsufficientCapacity":
            cls = BackingOffCapacity
        return cls(message, reason=reason)


class BackingOffCapacity(BackingOff):
    code = "RESOURCE_EXHAUSTED"


class PermanentFailure(BackingOff):
    """The last attempt failed for a cause the pinned commit never changes (an invalid listing,
    a listing of another digest): retrying is pointless, so kubelet gets a terminal code."""

    code = "FAILED_PRECONDITION"


class NoSpace(ModelsError):
    """The cache filesystem cannot hold the model; nothing was published."""

    code = "RESOURCE_EXHAUSTED"


class QuotaExceeded(ModelsError):
    """Downloading the model onto this node would take a ModelStoreBinding of the Pod's
    namespace past its quota; the message names the binding and the figures."""

    code = "RESOURCE_EXHAUSTED"


class AlreadyPublished(ModelsError):
    """The target is already published with other attributes."""

    code = "ALREADY_EXISTS"


class MountFailed(ModelsError):
    """A bind mount or unmount failed (the kernel's reason is in the message)."""

    code = "INTERNAL"


class CacheUnusable(ModelsError):
    """The cache root cannot be made or written (missing parent, read-only, full): the text is
    the reason in words, naming the path (``no space left on the device holding <path>``)."""

    code = "INTERNAL"


class CacheCorrupt(ModelsError):
    """The cache root has another layout version or unreadable records; refuse to open it."""

    code = "INTERNAL"

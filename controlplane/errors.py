"""The control plane's own errors: callers never see a ``kubernetes_asyncio`` or ``aiohttp`` error.

Third-party errors are mapped in exactly one place (:mod:`controlplane.k8s.client`) and chained
with ``from e``. The API classes follow the HTTP status, so retry policy is carried by type:
:class:`Conflict`, :class:`TooManyRequests` and :class:`ServerError` are temporary, the rest are
permanent for the request that caused them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bus import errors as bus_errors

__all__ = [
    "ApiError",
    "Conflict",
    "ControlPlaneError",
    "Gone",
    "Invalid",
    "NotFound",
    "ResolveFailed",
    "ServerError",
    "SinkUnavailable",
    "TooManyRequests",
]


class ControlPlaneError(Exception):
    """Base of every error the control plane raises."""


class ApiError(ControlPlaneError):
    """A request to the Kubernetes API (or to the KV ledger) failed.

    ``status`` is the HTTP status (0 when the server was not reached); ``message`` is truncated
    so a large error body never floods the log.
    """

    def __init__(self, status: int, message: str = "", *, retry_after_s: float | None = None):
        super().__init__(f"{status}: {message[:300]}")
        self.status = status
        self.message = message[:300]
        self.retry_after_s = retry_after_s


class NotFound(ApiError):
    """404: the object (or its resource type) does not exist."""


class Conflict(ApiError):
    """409: the object changed since it was read (stale resourceVersion) or already exists.

    Temporary: re-read and re-plan.
    """


class Gone(ApiError):
    """410: a watch's ``resourceVersion`` is too old; list again and watch from the list."""


class TooManyRequests(ApiError):
    """429: the server asks us to slow down; ``retry_after_s`` says how long when it said."""


class ServerError(ApiError):
    """5xx, or the server could not be reached (``status`` 0): temporary."""


class Invalid(ApiError):
    """Any other 4xx (400 bad request, 403 forbidden, 422 invalid): permanent for this body."""


class SinkUnavailable(ControlPlaneError):
    """No sink can be opened: no kubeconfig and no bus, or the bus refused the ledger bucket."""


class ResolveFailed(ControlPlaneError):
    """A ModelArtifact could not be resolved; ``reason`` is the condition reason.

    ``temporary``: the Hub could not answer now (retry with backoff); otherwise someone must
    change something (a token, the repository, the spec) before it can succeed.
    """

    def __init__(self, reason: str, message: str = "", *, temporary: bool = False) -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.message = message
        self.temporary = temporary


def for_status(status: int, message: str = "", *, retry_after_s: float | None = None) -> ApiError:
    """The error class for an HTTP status."""
    cls: type[ApiError]
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 410:
        cls = Gone
    elif status == 429:
        cls = TooManyRequests
    elif status == 0 or status >= 500:
        cls = ServerError
    else:
        cls = Invalid
    return cls(status, message, retry_after_s=retry_after_s)


TEMPORARY = (Conflict, TooManyRequests, ServerError)
"""Errors worth retrying with backoff."""


@contextmanager
def mapped_bus_errors(what: str) -> Iterator[None]:
    """Map a bus key-value failure to the API error the reconcilers already retry.

    A KV write that times out while JetStream elects a leader is temporary, exactly like a 5xx.
    """
    try:
        yield
    except bus_errors.KeyConflict as e:
        raise Conflict(409, f"{what}: {e}") from e
    except bus_errors.BusError as e:
        raise ServerError(0, f"{what}: {e}") from e

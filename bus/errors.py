"""The bus layer's own errors: callers never see a ``nats`` exception.

Every error raised by ``bus`` derives from :class:`BusError`. Third-party errors are mapped in
the transport modules only (``bus.connection``, ``bus.dialing``, ``bus.jetstream``) and chained
with ``from e`` so the cause stays in the traceback. The classes are named for what the caller
should do about them.
"""

from __future__ import annotations

__all__ = [
    "BusError",
    "DecodeFailed",
    "InvalidNodeName",
    "InvalidSubject",
    "InvalidToken",
    "KeyConflict",
    "NoAnswer",
    "NotConnected",
    "PublishFailed",
    "PublisherClosed",
    "ServerFailed",
    "StateUnavailable",
]


class BusError(Exception):
    """Base of every error the bus raises."""


class NotConnected(BusError):
    """Raised when an operation needs a live server connection and there is none right now.

    Temporary: the connection reconnects on its own; retry later (the publisher's outbox does).
    """


class NoAnswer(BusError):
    """Raised when a request found no responder, or no reply came in time.

    Temporary as far as the bus knows: the responder may be starting or restarting.
    """


class PublishFailed(BusError):
    """Raised when the server did not accept or acknowledge a message in time.

    Temporary for acknowledgement timeouts and missing streams during failover; the publisher
    keeps the event and retries.
    """


class PublisherClosed(BusError):
    """Raised by ``Publisher.publish`` after the publisher shut down (its context was left).

    Permanent for that publisher: the event was not accepted; open a new publisher to send it.
    """


class StateUnavailable(BusError):
    """Raised when the retained-state streams cannot be created or read (JetStream off or down)."""


class DecodeFailed(BusError):
    """Raised by the codec for a payload it refuses; ``reason`` is the metric label.

    Subscribers catch it, count it and drop the message: it never ends a subscription.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class InvalidNodeName(BusError, ValueError):
    """Raised for a node name that cannot be put into a subject token (empty, ``*``, ``>``, spaces).

    Permanent: the caller passed a name that would break routing.
    """


class InvalidSubject(BusError, ValueError):
    """Raised when a subject is not of the form ``gpustack.v1.node.<node>.<kind>``."""


class ServerFailed(BusError):
    """Raised when an embedded ``nats-server`` does not start or does not become ready."""


class KeyConflict(BusError):
    """Raised when a conditional key-value write finds another revision (or an existing key).

    Temporary: re-read the key and decide again.
    """


class InvalidToken(BusError, ValueError):
    """Raised for a NATS NKey or JWT that is malformed, badly signed or expired.

    Permanent for that token: an authorization request or credential that fails here is refused.
    """

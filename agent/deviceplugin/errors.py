"""Errors of the device plugin, named for the gRPC status kubelet must see.

Each class says which status it becomes; :mod:`server` maps them to ``grpclib.GRPCError`` in one
place, so nothing below it knows about gRPC.
"""

from __future__ import annotations

from agent.errors import AgentError


class DevicePluginError(AgentError):
    """Base of every error the device plugin raises on purpose."""


class BadRequest(DevicePluginError):
    """A request names a device id that is malformed or not ours (``InvalidArgument``).

    Raised before anything is charged, so the ledger is unchanged.
    """


class Conflict(DevicePluginError):
    """The request cannot be satisfied in the card's current state (``FailedPrecondition``).

    Raised when a card is held in another mode, or a shared request names one card twice. The
    ledger is unchanged; kubelet fails the pod with ``UnexpectedAdmissionError``.
    """


class Exhausted(DevicePluginError):
    """A card has fewer free units than the request needs (``ResourceExhausted``)."""


class CannotInject(DevicePluginError):
    """The vendor runtime cannot be described for a card (``FailedPrecondition``).

    Raised when, for example, an AMD card lacks its device-node numbers. Nothing is charged.
    """


class ActuationFailed(DevicePluginError):
    """Hardware refused to set up a grant, e.g. NVML could not create a MIG instance (``Internal``).

    Whatever was reserved for the request is released first, so the ledger is unchanged.
    """

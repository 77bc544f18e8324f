"""Errors of the agent layer, named for what the caller should do.

Third-party errors (NVML, file system) are mapped into these at the adapter boundary with
``raise ... from e``, so nothing above an adapter ever catches a vendor exception.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""


class DetectionError(AgentError):
    """A manufacturer's accelerators could not be detected although the node says they exist.

    Raised when, for example, NVIDIA PCI devices are present but NVML fails to initialise, or the
    sysfs tree of an AMD card cannot be read. The pass for that manufacturer is lost; the caller
    reports it (a one-shot exits non-zero, a service retries on the next period).
    """

    def __init__(self, manufacturer: str, message: str) -> None:
        super().__init__(f"{manufacturer}: {message}")
        self.manufacturer = manufacturer
        self.message = message


class HostReadError(AgentError):
    """A host file that exists could not be read (permissions, I/O error).

    A missing file is not an error: readers return ``None`` for it, because most sysfs attributes
    are optional and their absence only costs the field they feed.
    """


class ProfileError(AgentError):
    """A simulated-hardware profile is missing, malformed or inconsistent; the message says where."""


class StartFailed(AgentError):
    """The agent cannot start on this node as configured (a missing host directory)."""

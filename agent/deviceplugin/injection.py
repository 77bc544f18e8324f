"""What a container is given to reach its cards, as plain data: env, mounts, device nodes.

The responders (:mod:`responders`) decide an :class:`Injection`; only the gRPC layer
(:func:`encoding.container_response`) turns it into kubelet's ``ContainerAllocateResponse``.
Keeping the decision free of the generated stubs lets one-shots such as ``dm preflight`` ask
the very same responders without importing grpclib (an import-linter contract holds this).

Invariants: host paths are host paths (the plugin passes them to kubelet untranslated); the
order of ``mounts`` and ``devices`` is the responder's and is kept on the wire; nothing here
carries a pod identity, because kubelet's Allocate request has none.
"""

from __future__ import annotations

import msgspec


class Mount(msgspec.Struct, frozen=True, order=True):
    """A bind mount of ``host_path`` at ``container_path``."""

    container_path: str
    host_path: str
    read_only: bool


class DeviceNode(msgspec.Struct, frozen=True, order=True):
    """A device node made available at ``container_path``; ``permissions`` as cgroups spell
    them (``rw``, ``rwm``)."""

    container_path: str
    host_path: str
    permissions: str


class HostFile(msgspec.Struct, frozen=True, order=True):
    """A small file the plugin writes on the host before answering (a slicing runtime's
    per-container configuration), always inside one of the injection's ``host_dirs``."""

    path: str
    content: str


class DriverStep(msgspec.Struct, frozen=True, order=True):
    """A change to a card's driver state a grant needs before its container starts.

    ``kind`` names the step (``ascend-container-share``, ``cambricon-smlu``, ``metax-sgpu``);
    ``card`` is the accelerator id; ``parameters`` are the step's own, as ``key=value`` pairs in
    a fixed order. The plugin performs a step through the control registered for its kind and
    refuses the grant when none is (never starting a container that would run unconfined).
    """

    kind: str
    card: str
    parameters: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        shown = " ".join(f"{k}={v}" for k, v in self.parameters)
        return f"{self.kind} on {self.card}" + (f" ({shown})" if shown else "")


class Injection(msgspec.Struct, frozen=True, kw_only=True):
    """One container's share of a node's accelerators, in the allocator's own terms."""

    envs: dict[str, str] = msgspec.field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    host_dirs: tuple[str, ...] = ()
    """Host directories that must exist before the container starts: the per-allocation work
    directories the plugin creates (and removes once the allocation is released). Not sent to
    kubelet."""
    files: tuple[HostFile, ...] = ()
    """Files the plugin writes inside ``host_dirs`` before answering. Not sent to kubelet."""
    steps: tuple[DriverStep, ...] = ()
    """Driver changes the plugin makes before answering. Not sent to kubelet."""

    def library_mounts(self) -> list[Mount]:
        """Mounts of shared objects: what a slicing runtime preloads into every process."""
        return [m for m in self.mounts if m.container_path.endswith(".so")]

"""What a probe container receives: exactly the device plugin's Allocate injection, as plain data.

The responders (:mod:`agent.deviceplugin.responders`) build the kubelet's
``ContainerAllocateResponse``; preflight converts it once, in :func:`from_allocate_response`, into
an :class:`Injection` and never looks at the wire type again. The conversion reads attributes
only, so this module does not import the generated gRPC stubs; the responders module itself does
(``proto.deviceplugin.v1beta1`` → betterproto → grpclib), which is why :func:`respond` imports it
lazily, at the one place it is needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import msgspec

from agent.errors import AgentError
from bus import devices

Mode = str
"""``sliced`` or ``visibility`` (the modes preflight probes)."""


class InjectionError(AgentError):
    """The allocator refused to describe the injection for a card (the message says why)."""


class Injection(msgspec.Struct, frozen=True, kw_only=True):
    """Env, mounts and device nodes, in the allocator's own terms (host paths are host paths)."""

    envs: dict[str, str] = msgspec.field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = msgspec.field(default_factory=list)
    """``(container_path, host_path, read_only)``."""
    devices: list[tuple[str, str, str]] = msgspec.field(default_factory=list)
    """``(container_path, host_path, permissions)``."""

    def library_mounts(self) -> list[tuple[str, str, bool]]:
        """Mounts of shared objects: what a slicing runtime preloads into every process."""
        return [m for m in self.mounts if m[0].endswith(".so")]


class _MountLike(Protocol):
    container_path: str
    host_path: str
    read_only: bool


class _DeviceLike(Protocol):
    container_path: str
    host_path: str
    permissions: str


class AllocateResponseLike(Protocol):
    """The attributes of ``ContainerAllocateResponse`` this module reads."""

    @property
    def envs(self) -> Mapping[str, str]: ...
    @property
    def mounts(self) -> Iterable[_MountLike]: ...
    @property
    def devices(self) -> Iterable[_DeviceLike]: ...


def from_allocate_response(response: AllocateResponseLike) -> Injection:
    """Convert the kubelet response the device plugin would return into an :class:`Injection`."""
    return Injection(
        envs=dict(response.envs),
        mounts=[(m.container_path, m.host_path, bool(m.read_only)) for m in response.mounts],
        devices=[(d.container_path, d.host_path, d.permissions) for d in response.devices],
    )


def respond(
    group: devices.DeviceGroup,
    accelerator: devices.Accelerator,
    mode: Mode,
    *,
    host_lib_dir: str,
) -> Injection:
    """The injection the device plugin gives a container holding ``accelerator`` in ``mode``.

    Sliced asks for half the card (half of its slice tokens), as the reference probe does.

    :raises InjectionError: when the responder refuses (the card lacks a needed fact).
    """
    # Lazy: the responders import the generated stubs and with them grpclib (see module doc).
    from agent.deviceplugin import errors, responders
    from agent.deviceplugin.allocation import Grant
    from agent.deviceplugin.resources import cards_of

    one = msgspec.structs.replace(group, accelerators=(accelerator,))
    card = cards_of([one])[accelerator.id]
    tokens = tuple(range(max(1, card.sliced_count // 2))) if mode == "sliced" else (0,)
    grant = Grant(mode=mode, cards=((card, tokens),), holding=None)  # type: ignore[arg-type]
    try:
        response = responders.respond(grant, host_lib_dir=host_lib_dir)
    except errors.DevicePluginError as e:
        raise InjectionError(str(e)) from e
    return from_allocate_response(response)

"""The two hot replies of a device-plugin server, written straight to protobuf wire bytes.

betterproto builds and serializes messages at tens of microseconds per field. A node's
visibility list alone is 4,096 devices, so each ListAndWatch re-send would stall the event loop
for most of a second, holding up every Allocate behind it; and serializing one Allocate reply
cost more than deciding it. Both messages have small fixed shapes (kubelet's ``v1beta1`` API),
so they are written here by hand: a device list from tokens, each device once per token (tokens
are immutable and shared between plans, see :func:`resources._tokens`), and an Allocate reply
from ``dp`` messages. This is also the one place the responders' plain
:class:`injection.Injection` becomes a ``dp`` message (:func:`container_response`). The tests hold these bytes equal to betterproto's
serialization of the same messages, and fail when the generated messages gain a field.

Field numbers (``api.proto``): ListAndWatchResponse ``devices = 1``; Device ``ID = 1``,
``health = 2``, ``topology = 3``; TopologyInfo ``nodes = 1``; NUMANode ``ID = 1`` (int64).
AllocateResponse ``container_responses = 1``; ContainerAllocateResponse ``envs = 1``,
``mounts = 2``, ``devices = 3``, ``annotations = 4``, ``cdi_devices = 5``; Mount
``container_path = 1``, ``host_path = 2``, ``read_only = 3``; DeviceSpec ``container_path = 1``,
``host_path = 2``, ``permissions = 3``; CDIDevice ``name = 1``; map entries ``key = 1``,
``value = 2``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.deviceplugin.injection import Injection
from agent.deviceplugin.resources import HEALTHY, UNHEALTHY, Token
from proto.deviceplugin import v1beta1 as dp

_LENGTH_DELIMITED = 2
_VARINT = 0


def _varint(value: int) -> bytes:
    """Base-128 varint; a negative int64 is written as its 64-bit two's complement."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (string or embedded message)."""
    return _key(number, _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _string(number: int, value: str) -> bytes:
    """A string field; proto3 leaves an empty (default) one off the wire."""
    return _field(number, value.encode()) if value else b""


def _numa_node(node: int) -> bytes:
    # proto3 leaves a default (zero) scalar off the wire, as betterproto does
    return _key(1, _VARINT) + _varint(node) if node else b""


@functools.lru_cache(maxsize=32768)
def device(token: Token) -> bytes:
    """One ``devices`` entry of the response (field key included), for one token.

    Cached by value: a node's tokens in both health states fit several times over (8 cards
    advertise 5,208 tokens), so a re-send encodes only the tokens that changed.
    """
    body = _string(1, token.id) + _string(2, HEALTHY if token.healthy else UNHEALTHY)
    if token.numa_nodes:
        topology = b"".join(_field(1, _numa_node(n)) for n in token.numa_nodes)
        body += _field(3, topology)
    return _field(1, body)


def listing(tokens: Iterable[Token]) -> bytes:
    """The serialized ``ListAndWatchResponse`` advertising ``tokens`` in order."""
    return b"".join(device(t) for t in tokens)


@dataclass(frozen=True)
class Listing:
    """A serialized ``ListAndWatchResponse``; the servers' codec sends ``wire`` as it is."""

    wire: bytes


# ------------------------------------------------------------------ Allocate


def container_response(injection: Injection) -> dp.ContainerAllocateResponse:
    """kubelet's message for ``injection``: same envs, mounts, devices and annotations, in the
    same order (``host_dirs`` are the plugin's own business and are not sent)."""
    return dp.ContainerAllocateResponse(
        envs=dict(injection.envs),
        mounts=[dp.Mount(m.container_path, m.host_path, m.read_only) for m in injection.mounts],
        devices=[
            dp.DeviceSpec(d.container_path, d.host_path, d.permissions) for d in injection.devices
        ],
        annotations=dict(injection.annotations),
    )


def allocate_response(response: dp.AllocateResponse) -> bytes:
    """The serialized ``response``: byte for byte what betterproto writes, except that a map
    entry with an empty key and value is kept (as protobuf requires) where betterproto drops it."""
    return b"".join(_field(1, _container(c)) for c in response.container_responses)


def _container(response: dp.ContainerAllocateResponse) -> bytes:
    return b"".join(
        [
            _map(1, response.envs),
            *(_field(2, _mount(m)) for m in response.mounts),
            *(_field(3, _device_spec(d)) for d in response.devices),
            _map(4, response.annotations),
            *(_field(5, _string(1, c.name)) for c in response.cdi_devices),
        ]
    )


def _map(number: int, entries: Mapping[str, str]) -> bytes:
    return b"".join(_field(number, _string(1, k) + _string(2, v)) for k, v in entries.items())


def _mount(mount: dp.Mount) -> bytes:
    read_only = _key(3, _VARINT) + b"\x01" if mount.read_only else b""
    return _string(1, mount.container_path) + _string(2, mount.host_path) + read_only


def _device_spec(spec: dp.DeviceSpec) -> bytes:
    return (
        _string(1, spec.container_path) + _string(2, spec.host_path) + _string(3, spec.permissions)
    )

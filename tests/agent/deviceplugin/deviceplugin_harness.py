"""Device groups for the device-plugin tests (imported by conftest and the tests).

The gRPC side (fake kubelet, ListAndWatch reader, unary calls) is ``agent.testing``.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from agent.devices import detection, sources
from agent.devices.settings import DetectSettings
from bus import devices

# What kubelet must see registered (spelled out: the expected side of the contract).
NVIDIA = [
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/gpu.sliced",
    "nvidia.com/gpu.partitioned",
    "device.gpustack.ai/nvidia.visibility",
]
AMD = [
    "amd.com/gpu",
    "amd.com/gpu.shared",
    "amd.com/gpu.sliced",
    "device.gpustack.ai/amd.visibility",
]


def simulated(manufacturer: str, profile: str) -> list[devices.DeviceGroup]:
    settings = DetectSettings(manufacturers=(manufacturer,), simulate=profile)
    with sources.open_backends(settings) as backends:
        return detection.detect(backends).items


def with_health(
    groups: Sequence[devices.DeviceGroup], index: int, unhealthy: bool
) -> list[devices.DeviceGroup]:
    """``groups`` with the first group's card ``index`` marked (un)healthy; nothing else changes."""
    group = groups[0]
    accs = list(group.accelerators)
    status = msgspec.structs.replace(accs[index].status, unhealthy=unhealthy)
    accs[index] = msgspec.structs.replace(accs[index], status=status)
    return [msgspec.structs.replace(group, accelerators=tuple(accs)), *groups[1:]]

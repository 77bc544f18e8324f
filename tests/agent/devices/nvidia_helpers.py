"""Shared set-up for the NVIDIA tests: a simulated host, its sysfs tree and a backend over both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from agent.devices.hostfs import HostFS
from agent.devices.libs.nvml import Nvml
from agent.devices.nvidia import NvidiaBackend
from agent.devices.simulation import profiles, sysfs
from agent.devices.simulation.fakenvml import SimulatedNvml


@dataclass
class Rig:
    backend: NvidiaBackend
    sim: SimulatedNvml
    nvml: Nvml


def with_faults(profile: profiles.Profile, faults: dict[int, dict[str, str]]) -> profiles.Profile:
    """The profile with ``faults[i]`` set on NVIDIA card ``i``."""
    assert profile.nvidia is not None
    cards = tuple(
        msgspec.structs.replace(card, faults=faults.get(i, {}))
        for i, card in enumerate(profile.nvidia.cards)
    )
    return msgspec.structs.replace(
        profile, nvidia=msgspec.structs.replace(profile.nvidia, cards=cards)
    )


def rig(
    tmp_path: Path,
    name: str = "nvidia-h200x8",
    *,
    faults: dict[int, dict[str, str]] | None = None,
    system_faults: dict[str, str] | None = None,
    with_sysfs: bool = True,
    pci_check: bool = True,
    init_error: str | None = None,
) -> Rig:
    """A backend over a simulated profile; ``with_sysfs=False`` leaves the host tree empty."""
    profile = with_faults(profiles.load(name), faults or {})
    assert profile.nvidia is not None
    if init_error is not None:
        profile = msgspec.structs.replace(
            profile, nvidia=msgspec.structs.replace(profile.nvidia, init_error=init_error)
        )
    host = sysfs.materialize(profile, tmp_path) if with_sysfs else HostFS(tmp_path)
    sim = SimulatedNvml(profile.nvidia, system_faults=system_faults)
    nvml = Nvml(sim)
    backend = NvidiaBackend(host=host, nvml=nvml, pci_check=pci_check, simulated=True)
    return Rig(backend=backend, sim=sim, nvml=nvml)

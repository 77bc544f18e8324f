"""Build the backends a pass runs: real hardware under a host root, or a simulated profile.

A simulated profile is turned into a sysfs tree in a temporary directory plus a pynvml-compatible
object, so exactly the same backend code runs in both cases; only where the bytes come from
differs. The context manager removes the temporary tree.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.devices import amd, detection, nvidia, nvml, pci
from agent.devices.hostfs import HostFS
from agent.devices.manufacturers import MANUFACTURERS, WITH_BACKEND
from agent.settings import DetectSettings

log = logging.getLogger(__name__)


@contextmanager
def open_backends(settings: DetectSettings) -> Iterator[list[detection.Backend]]:
    """Yield the backends for ``settings.manufacturers`` that this build has.

    :raises ProfileError: when ``settings.simulate`` names a bad profile.
    """
    if settings.simulate is None:
        host = HostFS(Path(settings.host_root))
        yield _backends(settings, host, nvml.Nvml(), simulated=False)
        return
    # Simulation is imported only when asked for: real runs never load it.
    from agent.devices.simulation import fakenvml, profiles, sysfs

    profile = profiles.load(settings.simulate)
    with tempfile.TemporaryDirectory(prefix="gpustack-sim-", dir=_scratch_dir()) as directory:
        host = sysfs.materialize(profile, Path(directory))
        log.warning(
            "simulating accelerators from profile %r (%s): nothing below is real hardware",
            settings.simulate,
            profile.description,
        )
        library = fakenvml.SimulatedNvml(profile.nvidia)
        yield _backends(settings, host, nvml.Nvml(library), simulated=True)


def _scratch_dir() -> str | None:
    """Where to lay out a simulated tree: memory-backed ``/dev/shm`` when writable.

    A tree is a few hundred small files; on a disk-backed ``/tmp`` creating them costs more
    than the whole detection pass (see docs/benchmarks.md).
    """
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _backends(
    settings: DetectSettings, host: HostFS, nvml_adapter: nvml.Nvml, *, simulated: bool
) -> list[detection.Backend]:
    backends: list[detection.Backend] = []
    missing: list[str] = []
    for key in settings.manufacturers:
        if key == "nvidia":
            backends.append(
                nvidia.NvidiaBackend(
                    host=host, nvml=nvml_adapter, pci_check=settings.pci_check, simulated=simulated
                )
            )
        elif key == "amd":
            backends.append(
                amd.AmdBackend(host=host, pci_check=settings.pci_check, simulated=simulated)
            )
        else:
            missing.append(key)
    if missing:
        _note_missing_backends(settings, host, missing)
    return backends


def _note_missing_backends(settings: DetectSettings, host: HostFS, keys: list[str]) -> None:
    """Say on stderr when a manufacturer we cannot detect may be present, instead of hiding it.

    One pass over the PCI tree covers every such manufacturer.
    """
    supported = ", ".join(WITH_BACKEND)
    if settings.explicit_manufacturers:
        for key in keys:
            log.warning("detection of %s is not available in this build (only %s)", key, supported)
        return
    found = pci.scan_vendors(host, {MANUFACTURERS[k].pci_vendor for k in keys})
    for key in keys:
        functions = found.get(MANUFACTURERS[key].pci_vendor, [])
        if functions:
            log.warning(
                "%d %s accelerator(s) on PCI (%s) but this build cannot detect %s (only %s)",
                len(functions),
                key,
                ", ".join(f.bdf for f in functions),
                key,
                supported,
            )

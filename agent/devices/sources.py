"""Build the backends a pass runs: real hardware under a host root, or a simulated profile.

A simulated profile is turned into a sysfs tree in a temporary directory plus a pynvml-compatible
object and, for the seven library-read manufacturers, objects answering their libraries' C calls
(made only if a backend gets past its PCI check), so exactly the same backend code runs in both
cases; only where the bytes come from differs. The context manager removes the temporary tree.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.devices import amd, detection, nvidia, vendor
from agent.devices.hostfs import HostFS
from agent.devices.libs import nvml
from agent.devices.manufacturers import MANUFACTURERS
from agent.devices.settings import DetectSettings

log = logging.getLogger(__name__)


@contextmanager
def open_backends(
    settings: DetectSettings, clock: Callable[[], float] = time.time
) -> Iterator[list[detection.Backend]]:
    """Yield the backends for ``settings.manufacturers`` that this build has.

    ``clock`` moves a simulated profile's ``load`` patterns (tests inject one).

    :raises ProfileError: when ``settings.simulate`` names a bad profile.
    """
    if settings.simulate is None:
        host = HostFS(Path(settings.host_root))
        with _closing(_backends(settings, host, nvml.Nvml(), simulated=False)) as backends:
            yield backends
        return
    # Simulation is imported only when asked for: real runs never load it.
    from agent.devices.simulation import fakenvml, libraries, moving, profiles, sysfs

    profile = profiles.load(settings.simulate)
    with tempfile.TemporaryDirectory(prefix="gpustack-sim-", dir=_scratch_dir()) as directory:
        tree = sysfs.materialize(profile, Path(directory))
        host = moving.MovingHostFS(root=tree.root, amd=profile.amd, clock=clock)
        log.warning(
            "simulating accelerators from profile %r (%s): nothing below is real hardware",
            settings.simulate,
            profile.description,
        )
        library = fakenvml.SimulatedNvml(profile.nvidia, clock=clock)  # load moves by it
        simulators = {
            key: libraries.factory(key, profile, clock) for key in libraries.simulated_keys()
        }
        made = _backends(settings, host, nvml.Nvml(library), simulated=True, libraries=simulators)
        with _closing(made) as backends:
            yield backends


@contextmanager
def _closing(backends: list[detection.Backend]) -> Iterator[list[detection.Backend]]:
    """Yield ``backends``, then close those that hold state between passes (GPM samples)."""
    try:
        yield backends
    finally:
        for backend in backends:
            close: Callable[[], None] | None = getattr(backend, "close", None)
            if close is not None:
                close()


def _scratch_dir() -> str | None:
    """Where to lay out a simulated tree: memory-backed ``/dev/shm`` when writable.

    A tree is a few hundred small files; on a disk-backed ``/tmp`` creating them costs more
    than the whole detection pass (see docs/benchmarks.md).
    """
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _backends(
    settings: DetectSettings,
    host: HostFS,
    nvml_adapter: nvml.Nvml,
    *,
    simulated: bool,
    libraries: dict[str, Callable[[], Any]] | None = None,
) -> list[detection.Backend]:
    """A backend per manufacturer asked for; the seven library-read ones share one PCI scan.

    ``libraries`` makes each library-read manufacturer's simulated library (simulation only);
    on real hardware the backends load the host's libraries themselves, on first need.
    """
    backends: list[detection.Backend] = []
    census = vendor.PciCensus(
        host, {MANUFACTURERS[k].pci_vendor for k in settings.manufacturers if k in vendor.READERS}
    )
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
            backends.append(
                vendor.VendorBackend(
                    key,
                    host=host,
                    census=census,
                    library=(libraries or {})[key] if simulated else None,
                    pci_check=settings.pci_check,
                    simulated=simulated,
                )
            )
    return backends

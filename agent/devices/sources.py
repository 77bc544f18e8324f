"""Build the backends a pass runs: real hardware under a host root, or a simulated profile.

A simulated profile is turned into a sysfs tree in a temporary directory plus a pynvml-compatible
object, so exactly the same backend code runs in both cases; only where the bytes come from
differs. The context manager removes the temporary tree.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.devices import amd, clib, detection, nvidia, nvml, pci, vendor
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
    from agent.devices.simulation import fakenvml, libraries, profiles, sysfs

    profile = profiles.load(settings.simulate)
    with tempfile.TemporaryDirectory(prefix="gpustack-sim-", dir=_scratch_dir()) as directory:
        host = sysfs.materialize(profile, Path(directory))
        log.warning(
            "simulating accelerators from profile %r (%s): nothing below is real hardware",
            settings.simulate,
            profile.description,
        )
        library = fakenvml.SimulatedNvml(profile.nvidia)
        simulators = {key: libraries.factory(key, profile) for key in libraries.simulated_keys()}
        yield _backends(settings, host, nvml.Nvml(library), simulated=True, libraries=simulators)


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
    """The backends asked for; the seven library-read ones share one PCI scan per pass."""
    backends: list[detection.Backend] = []
    missing: list[str] = []
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
        elif key in vendor.READERS:
            backends.append(
                vendor.VendorBackend(
                    key,
                    host=host,
                    census=census,
                    library=(libraries or {}).get(key, _absent(key)) if simulated else None,
                    pci_check=settings.pci_check,
                    simulated=simulated,
                )
            )
        else:
            missing.append(key)
    if missing:
        _note_missing_backends(settings, host, missing)
    return backends


def _absent(key: str) -> Callable[[], Any]:
    """A simulated host whose profile format has no section for ``key``: no library."""

    def make() -> Any:
        raise clib.LibUnavailable(
            f"load {key} library", clib.LIBRARY_NOT_FOUND, "LIBRARY_NOT_FOUND", "not simulated"
        )

    return make


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

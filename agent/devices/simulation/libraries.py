"""Which simulated library stands in for each library-read manufacturer, made on demand.

A profile without a manufacturer's section simulates a host without its library: opening it
fails as ``dlopen`` would, with the adapter's "library not found" error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agent.devices.libs import clib
from agent.devices.simulation import moving
from agent.devices.simulation.profiles import Profile

_SIMULATORS = {
    "ascend": ("agent.devices.simulation.fakedcmi", "SimulatedDcmi", "libdcmi.so"),
    "cambricon": ("agent.devices.simulation.fakecndev", "SimulatedCndev", "libcndev.so"),
    "hygon": ("agent.devices.simulation.fakerocmsmi", "SimulatedRocmSmi", "librocm_smi64.so"),
    "iluvatar": ("agent.devices.simulation.fakenvmlabi", "iluvatar", "libixml.so"),
    "metax": ("agent.devices.simulation.fakemxsml", "SimulatedMxsml", "libmxsml.so"),
    "mthreads": ("agent.devices.simulation.fakemtml", "SimulatedMtml", "libmtml.so"),
    "thead": ("agent.devices.simulation.fakenvmlabi", "thead", "libhgml.so"),
}
"""Manufacturer → (module, its maker from the profile section, the library it stands in for)."""


def factory(
    key: str, profile: Profile, clock: Callable[[], float] | None = None
) -> Callable[[], Any]:
    """A maker of ``key``'s simulated library from ``profile``.

    A profile with a section for ``key`` builds its simulator now, so a bad fault or error name
    is a :class:`ProfileError` before any pass; a profile without one imports nothing. With a
    ``clock``, a section's ``load`` pattern moves its cards (:mod:`.moving`).
    """
    module, cls, soname = _SIMULATORS[key]
    section = getattr(profile, key)
    if section is not None and section.library_installed:
        made = getattr(importlib.import_module(module), cls)(moving.moving(key, section, clock))
        return lambda: made

    def absent() -> Any:
        raise clib.LibUnavailable(
            f"load {soname}", clib.LIBRARY_NOT_FOUND, "LIBRARY_NOT_FOUND",
            f"{soname}: cannot open shared object file (not in the simulated profile)",
        )  # fmt: skip

    return absent


def simulated_keys() -> tuple[str, ...]:
    return tuple(_SIMULATORS)

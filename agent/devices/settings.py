"""The settings of device detection (``dm detect``, ``dm monitor``, the detection part of
``dm serve`` and ``dm preflight``): frozen, typed, built from flags at the edge only.

They live in the devices package, not beside the other agent settings, because the backends'
builder (:mod:`agent.devices.sources`) takes them: ``agent.devices`` imports nothing of the
agent above it, so ``agent.settings`` (which builds the agents' settings) may import it freely.
"""

from __future__ import annotations

from typing import Literal, cast

import msgspec

from agent.devices.manufacturers import UnknownManufacturer, parse_manufacturers
from kit.options import Flags, Options, SettingsError

__all__ = [
    "DetectSettings",
    "detect_settings_from",
    "detection_from",
    "manufacturers_from",
    "simulate_from",
]


class DetectSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of ``dm detect`` and ``dm monitor`` (and the detection part of ``dm serve``)."""

    manufacturers: tuple[str, ...]
    """Manufacturer keys asked for, sorted."""
    explicit_manufacturers: bool = False
    """True when ``--manufacturer`` named them (so a missing backend is worth a warning)."""
    pci_check: bool = True
    fast_failed: bool = True
    """Hold back a first pass that found nothing and detect again (one manufacturer only)."""
    retries: int = 2
    retry_delay_s: float = 1.0
    host_root: str = "/"
    """Where the host's ``/`` is (``GPUSTACK_HOST_ROOT``): captured trees, containers."""
    simulate: str | None = None
    """A simulated-hardware profile name or path; None for real hardware."""
    output: Literal["yaml", "json", "wide", "name"] = "yaml"


class DetectFlags(Flags, frozen=True, kw_only=True):
    """The detection flags ``dm detect``, ``dm monitor`` and ``dm serve`` share."""

    manufacturer: str
    no_pci_check: bool
    no_fast_failed: bool
    simulate: str


class OutputFlags(Flags, frozen=True, kw_only=True):
    output: str


def manufacturers_from(text: str) -> tuple[tuple[str, ...], bool]:
    """``--manufacturer`` as sorted keys, and whether it named any (else: all of them)."""
    try:
        return tuple(parse_manufacturers(text)), bool(text.strip())
    except UnknownManufacturer as e:
        raise SettingsError(f"--manufacturer: {e}") from e


def simulate_from(simulate: str) -> str | None:
    """``--simulate``, its profile loaded once here so a missing, oversized or invalid one is
    one line and exit 2 for every command, services included (``list`` is the one-shots').

    :raises SettingsError: naming ``--simulate`` and why the profile cannot be used.
    """
    if not simulate or simulate == "list":
        return simulate or None
    from agent.devices.simulation import profiles  # only a simulating process loads it
    from agent.errors import ProfileError

    try:
        profiles.load(simulate)
    except ProfileError as e:
        raise SettingsError(f"--simulate: {e}") from e
    return simulate


def detect_settings_from(options: Options) -> DetectSettings:
    """``dm detect`` and ``dm monitor``: the detection flags and ``--output``."""
    output = options.read_flags(OutputFlags).output
    detect = detection_from(options)
    return msgspec.structs.replace(detect, output=cast(Literal["yaml", "json", "wide"], output))


def detection_from(options: Options) -> DetectSettings:
    """The detection part of ``dm detect``, ``dm monitor`` and ``dm serve``."""
    flags = options.read_flags(DetectFlags)
    manufacturers, explicit = manufacturers_from(flags.manufacturer)
    return DetectSettings(
        manufacturers=manufacturers,
        explicit_manufacturers=explicit,
        pci_check=not flags.no_pci_check,
        fast_failed=not flags.no_fast_failed,
        host_root=options.env.get("GPUSTACK_HOST_ROOT") or "/",
        simulate=simulate_from(flags.simulate),
    )

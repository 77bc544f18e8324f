"""The settings of the agent's commands: frozen, typed, built from flags at the edge only.

Nothing below the command modules reads the environment or the command line; they receive one
of these objects.
"""

from __future__ import annotations

import re
import socket
from typing import Literal, cast

import msgspec

from agent.devices.manufacturers import UnknownManufacturer, parse_manufacturers
from kit.options import Flags, Options, SettingsError

_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")


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


class NodeFlags(Flags, frozen=True, kw_only=True):
    node_name: str


class DetectFlags(Flags, frozen=True, kw_only=True):
    """The detection flags ``dm detect``, ``dm monitor`` and ``dm serve`` share."""

    manufacturer: str
    no_pci_check: bool
    no_fast_failed: bool
    simulate: str


class OutputFlags(Flags, frozen=True, kw_only=True):
    output: str


def node_name_from(options: Options) -> str:
    """The node an agent runs on: ``--node-name``, else ``KUBERNETES_NODE_NAME``, else the host.

    The one rule for every agent (``dm serve``, ``model-manager``, ``standalone``); the
    DaemonSets set ``KUBERNETES_NODE_NAME`` from the downward API. The host name is lowercased
    as kubelet does. :raises SettingsError: not a Kubernetes node name (a DNS subdomain), so
    nothing such as ``a*b`` ever reaches a bus subject.
    """
    name = (
        options.read_flags(NodeFlags).node_name
        or options.env.get("KUBERNETES_NODE_NAME")
        or socket.gethostname().lower()
    )
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise SettingsError(
            f"node name {name!r} is not a Kubernetes node name (lowercase letters, digits, "
            "'-' and '.'); set --node-name or KUBERNETES_NODE_NAME"
        )
    return name


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

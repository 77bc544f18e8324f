"""The settings of the agent's commands: frozen, typed, built from flags at the edge only.

Nothing below the command modules reads the environment or the command line; they receive one
of these objects.
"""

from __future__ import annotations

from typing import Literal

import msgspec


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
    output: Literal["yaml", "json"] = "yaml"

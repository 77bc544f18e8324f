"""Settings of ``dm preflight``: frozen, built once from flags and environment at the edge."""

from __future__ import annotations

from typing import Literal

import msgspec

HOST_LIB_DIR = "/var/lib/gpustack/operator/lib"
"""Where the device plugin's sliced injection mounts preload libraries from (host path)."""
SCRATCH_DIR = "/var/lib/gpustack/operator/preflight"
"""Host directory for files the responders render for a probe, and the lock; removed at the end
except the lock file itself."""
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class PreflightSettings(msgspec.Struct, frozen=True, kw_only=True):
    manufacturers: tuple[str, ...]
    explicit_manufacturers: bool = False
    dry_run: bool = False
    probe_image: str = ""
    host_root: str = "/host"
    runtime: Literal["", "docker", "nerdctl", "ctr"] = ""
    pci_check: bool = True
    simulate: str | None = None
    output: Literal["yaml", "json"] = "yaml"
    lib_source: str = "/usr/share/gpustack-operator/lib"
    """This image's copy of the preload library tree, laid out as ``<manufacturer>/…`` exactly as
    it is staged under :data:`HOST_LIB_DIR` (``GPUSTACK_PREFLIGHT_LIB_SOURCE``)."""
    chroot: str = "/usr/sbin/chroot"
    host_path: str = HOST_PATH
    """``PATH`` for commands run inside the host root (the host's, not this image's)."""
    command_timeout_s: float = 30.0
    """Limit of one host command that is not a probe (listing, removing, vendor CLI)."""
    probe_timeout_s: float = 300.0
    """Limit of one probe container, image pull included."""
    hold_s: float = 2.0
    """How long each of a co-tenancy pair keeps running, so the two overlap on the card."""

"""Host paths under one root, so detection can read a captured or simulated tree.

Every host path the detectors read (``/sys``, ``/proc``, ``/dev``, ``/opt/rocm``,
``/usr/share/...``) goes through :class:`HostFS`. The root comes from ``GPUSTACK_HOST_ROOT``
(read at the command-line edge only) and defaults to ``/``.

Invariant: a missing file reads as ``None``; an unreadable one raises :class:`HostReadError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agent.errors import HostReadError


@dataclass(frozen=True)
class HostFS:
    root: Path = Path("/")

    def path(self, host_path: str) -> Path:
        """Map an absolute host path (``/sys/...``) to where it lives under the root."""
        return self.root / host_path.lstrip("/")

    def exists(self, host_path: str) -> bool:
        return self.path(host_path).exists()

    def read_text(self, host_path: str) -> str | None:
        """Return the stripped contents, ``None`` when the file does not exist."""
        path = self.path(host_path)
        try:
            return path.read_text(encoding="utf-8", errors="replace").strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            # ENODEV/EINVAL are how many sysfs attributes say "not supported on this device".
            if e.errno in (19, 22, 61, 95):
                return None
            raise HostReadError(f"cannot read {path}: {e.strerror or e}") from e

    def read_int(self, host_path: str) -> int | None:
        """Return the file as an integer (decimal, or hex with ``0x``), ``None`` if absent or junk."""
        text = self.read_text(host_path)
        if not text:
            return None
        try:
            return int(text, 16) if text.lower().startswith("0x") else int(text, 10)
        except ValueError:
            return None

    def list_dir(self, host_path: str) -> list[str]:
        """Return sorted entry names, or an empty list when the directory does not exist."""
        path = self.path(host_path)
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise HostReadError(f"cannot list {path}: {e.strerror or e}") from e

    def resolve_link(self, host_path: str) -> str | None:
        """Resolve a symlink inside the host tree and return the *host* path it points to.

        Absolute targets are taken relative to the root, so a captured tree with absolute
        links still resolves inside itself.
        """
        path = self.path(host_path)
        try:
            target = os.readlink(path)
        except OSError:
            return None
        if os.path.isabs(target):
            return os.path.normpath(target)
        # Resolve from the link's real directory: the path may itself pass through links.
        root = os.path.realpath(self.root)
        real = os.path.normpath(os.path.join(os.path.realpath(path.parent), target))
        return "/" + os.path.relpath(real, root)

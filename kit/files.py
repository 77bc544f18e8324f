"""Small durable files a process keeps on its node: written whole or not at all.

A crash (or a node losing power) mid-write leaves the previous version, never a torn one, and
the file is private to the process's user: it records what a node serves, nobody else's read.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomically", "write_private"]


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (mode 0600), durable when this returns; the directory is
    created (0700) when missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(path, data, mode=0o600)


def write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    """Replace ``path`` with ``data`` (``mode``): never a torn file, durable when this returns.

    The temporary file is unique to this call (``mkstemp``), so threads writing one file at
    once cannot rename each other's file away; it is removed when the write fails. The
    directory is fsynced after the rename, so the new name survives a power loss too.
    """
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)

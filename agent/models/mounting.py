"""Bind mounts through the kernel (``mount(2)``/``umount2(2)`` via libc) and mountinfo parsing.

A read-only bind needs two calls: ``MS_BIND`` then a remount with ``MS_RDONLY|MS_NOSUID|MS_NODEV``
(the flags of the first call are ignored by the kernel for a bind). If the remount fails the
bind is undone, so a target is never left writable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.models.errors import MountFailed

__all__ = ["MountInfo", "bind_read_only", "is_mount_point", "parse_mountinfo", "unmount"]

MS_RDONLY: Final = 1
MS_NOSUID: Final = 2
MS_NODEV: Final = 4
MS_REMOUNT: Final = 32
MS_BIND: Final = 4096
MNT_DETACH: Final = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise MountFailed(f"{what}: {os.strerror(e)}") from OSError(e, os.strerror(e))


def bind_read_only(source: Path, target: Path) -> None:
    """Bind ``source`` at ``target`` read-only, nosuid, nodev. :raises MountFailed:."""
    src, dst = os.fsencode(source), os.fsencode(target)
    _call(_libc.mount(src, dst, None, MS_BIND, None), f"bind {source} at {target}")
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
    if _libc.mount(None, dst, None, flags, None) != 0:
        e = ctypes.get_errno()
        _libc.umount2(dst, MNT_DETACH)
        raise MountFailed(f"remount {target} read-only: {os.strerror(e)}")


def unmount(target: Path) -> None:
    """Unmount ``target``; a busy one is detached lazily. Not mounted is not an error."""
    dst = os.fsencode(target)
    if _libc.umount2(dst, 0) == 0:
        return
    e = ctypes.get_errno()
    if e in (errno.EINVAL, errno.ENOENT):
        return
    if e == errno.EBUSY:
        _call(_libc.umount2(dst, MNT_DETACH), f"detach {target}")
        return
    raise MountFailed(f"unmount {target}: {os.strerror(e)}")


@dataclass(frozen=True)
class MountInfo:
    """One line of ``/proc/self/mountinfo`` (the fields we use)."""

    device: str
    """``major:minor`` of the filesystem."""
    root: str
    """The path inside that filesystem that is mounted (a bind's source)."""
    mount_point: str
    read_only: bool


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \\ooo octal
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountInfo]:
    """Parse mountinfo text; malformed lines are skipped, never fatal."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 10:
            continue
        options = fields[5].split(",")
        mounts.append(
            MountInfo(fields[2], _unescape(fields[3]), _unescape(fields[4]), "ro" in options)
        )
    return mounts


def read_mountinfo(path: Path = Path("/proc/self/mountinfo")) -> list[MountInfo]:
    return parse_mountinfo(path.read_text(errors="replace"))


def is_mount_point(target: Path, mounts: list[MountInfo] | None = None) -> MountInfo | None:
    """The (last, i.e. visible) mount at ``target``, or None."""
    found = None
    for m in mounts if mounts is not None else read_mountinfo():
        if m.mount_point == str(target):
            found = m
    return found

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

__all__ = [
    "MountInfo",
    "bind_read_only",
    "bind_read_only_at",
    "is_mount_point",
    "parse_mountinfo",
    "unmount",
    "unmount_at",
]

MS_RDONLY: Final = 1
MS_NOSUID: Final = 2
MS_NODEV: Final = 4
MS_REMOUNT: Final = 32
MS_BIND: Final = 4096
MNT_DETACH: Final = 2
UMOUNT_NOFOLLOW: Final = 8
MAX_STACKED: Final = 16
"""Mounts :func:`unmount_at` peels off one target before it gives up (a loop's bound)."""
_NOFOLLOW: Final = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC

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


def bind_read_only_at(source: Path, parent: int, name: str, shown: Path) -> None:
    """Bind ``source`` read-only, nosuid, nodev on the directory ``name`` in the directory
    ``parent`` (a descriptor), never following a link: the mount goes through
    ``/proc/self/fd`` of an ``O_NOFOLLOW`` descriptor, and the read-only remount through one
    opened on the new mount. ``shown`` is the target for messages. :raises MountFailed:."""
    fd = _open_nofollow(name, parent, shown)
    try:
        _call(
            _libc.mount(os.fsencode(source), _proc(fd), None, MS_BIND, None),
            f"bind {source} at {shown}",
        )
    finally:
        os.close(fd)
    fd = _open_nofollow(name, parent, shown)  # now the root of the bind just made
    try:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        if _libc.mount(None, _proc(fd), None, flags, None) != 0:
            e = ctypes.get_errno()
            _libc.umount2(_proc(fd), MNT_DETACH)
            raise MountFailed(f"remount {shown} read-only: {os.strerror(e)}")
    finally:
        os.close(fd)


def unmount_at(parent: int, name: str, shown: Path) -> None:
    """Unmount every mount stacked on ``name`` in the directory ``parent`` (a descriptor),
    without following a link; a busy one is detached lazily. Not mounted is not an error.
    :raises MountFailed: an unmount failed, or over :data:`MAX_STACKED` mounts."""
    path = os.fsencode(f"/proc/self/fd/{parent}/") + os.fsencode(name)
    for _ in range(MAX_STACKED):
        if _libc.umount2(path, UMOUNT_NOFOLLOW) != 0:
            e = ctypes.get_errno()
            if e in (errno.EINVAL, errno.ENOENT):
                return  # not (or no longer) a mount point
            if e != errno.EBUSY:
                raise MountFailed(f"unmount {shown}: {os.strerror(e)}")
            _call(_libc.umount2(path, UMOUNT_NOFOLLOW | MNT_DETACH), f"detach {shown}")
    raise MountFailed(f"unmount {shown}: still mounted after {MAX_STACKED} unmounts")


def _open_nofollow(name: str, parent: int, shown: Path) -> int:
    try:
        return os.open(name, _NOFOLLOW, dir_fd=parent)
    except OSError as e:
        raise MountFailed(f"cannot open {shown} (a directory, not a link): {e.strerror}") from e


def _proc(fd: int) -> bytes:
    return f"/proc/self/fd/{fd}".encode()


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

"""Where a CSI target path really is: checked as text, then reached without following a link.

A lexical check (absolute, normalized, under ``<kubelet>/pods``) is not enough: a symlink
``<kubelet>/pods/evil -> /outside`` passes it, and ``mount(2)`` follows links, so the model tree
would be mounted outside the kubelet directory. So every path operation on a target goes through
:func:`parent`: it opens ``<kubelet>/pods`` and then each directory below it with
``O_PATH | O_NOFOLLOW | O_DIRECTORY``, one component at a time, so a symlink (or a file) anywhere
below the pods directory fails the walk instead of being followed. The mount, the unmount and the
``rmdir`` then name the target relative to that descriptor (``/proc/self/fd/<n>/mount``,
``dir_fd=``), so a link swapped in after the check is not followed either. The pods directory
itself comes from our own settings and may be a link.

Invariant: a target this module hands out lies, by its real path, under the real pods directory.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from agent.models.errors import InvalidVolume, MountFailed

__all__ = ["MAX_TARGET_BYTES", "checked", "parent", "real", "under"]

MAX_TARGET_BYTES: Final = 4095
"""``PATH_MAX`` (4096) less the terminating NUL: a longer path cannot name a file on Linux."""
_WALK: Final = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


def checked(raw: str, pods_dir: Path) -> Path:
    """``raw`` as a path, if it is one kubelet could mean. :raises InvalidVolume: naming why."""
    if not raw:
        raise InvalidVolume("target_path is required")
    shown = raw[:200]
    if "\0" in raw:
        raise InvalidVolume(f"target_path {shown!r} holds a NUL byte")
    try:
        size = len(os.fsencode(raw))
    except UnicodeError as e:
        raise InvalidVolume(f"target_path {shown!r} is not encodable: {e}") from e
    if size > MAX_TARGET_BYTES:
        raise InvalidVolume(f"target_path {shown!r}... is over {MAX_TARGET_BYTES} bytes")
    if not os.path.isabs(raw) or os.path.normpath(raw) != raw.rstrip("/"):
        raise InvalidVolume(f"target_path {shown!r} is not an absolute, normalized path")
    target = Path(raw)
    if pods_dir not in target.parents:
        raise InvalidVolume(f"target_path {shown!r} is not under {pods_dir}")
    return target


def real(target: Path, pods_dir: Path) -> Path:
    """Where ``target`` is, as mountinfo names it: the pods directory's real path (it may be a
    link, e.g. ``/var/lib/kubelet -> /data/kubelet``) joined with the rest, which the walk of
    :func:`parent` found free of links."""
    return Path(os.path.realpath(pods_dir)) / target.relative_to(pods_dir)


def under(mount_point: Path, pods_dir: Path) -> Path | None:
    """The target kubelet names for a mount point mountinfo shows, or None when the mount
    point is not under the pods directory's real path (the inverse of :func:`real`)."""
    real_pods = Path(os.path.realpath(pods_dir))
    if real_pods not in mount_point.parents:
        return None
    return pods_dir / mount_point.relative_to(real_pods)


@contextmanager
def parent(target: Path, pods_dir: Path) -> Iterator[int]:
    """An ``O_PATH`` descriptor of ``target``'s parent, reached from ``pods_dir`` through real
    directories only; closed when the block exits. ``target`` comes from :func:`checked`.

    :raises InvalidVolume: a component is a symlink, not a directory, or too long a name.
    :raises FileNotFoundError: a component does not exist (the caller decides what that means).
    :raises MountFailed: the pods directory or a component cannot be opened otherwise.
    """
    fd = _open(str(pods_dir), None, target)
    try:
        for name in target.parent.relative_to(pods_dir).parts:
            nxt = _open(name, fd, target)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _open(name: str, dir_fd: int | None, target: Path) -> int:
    flags = _WALK if dir_fd is not None else os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise InvalidVolume(
                f"target_path {str(target)[:200]!r}: {name[:80]!r} is a symlink or not a "
                "directory; a target must really lie under the kubelet pods directory"
            ) from e
        if e.errno == errno.ENAMETOOLONG:
            raise InvalidVolume(f"target_path {str(target)[:200]!r}: a name is too long") from e
        raise MountFailed(f"cannot open {name[:200]} on the way to {target}: {e.strerror}") from e

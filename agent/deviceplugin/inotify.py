"""A tiny Linux inotify reader: wake up when entries of one directory are created or deleted.

Only used to notice a kubelet restart sooner than the periodic level check would; callers must
not depend on it (:func:`open_watch` returns None where inotify is unavailable, and the caller
polls instead). Events are not interpreted here: any change in the directory is a reason to look.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import warnings
from collections.abc import Iterator

import anyio

log = logging.getLogger(__name__)

IN_CREATE = 0x100
IN_DELETE = 0x200
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_DELETE_SELF = 0x400
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF


class DirectoryWatch:
    """An inotify descriptor watching one directory; close it with :meth:`close`.

    Closing twice is harmless (a second ``os.close`` could hit a reused descriptor number, so
    the first one forgets it); one collected unclosed is closed with a ``ResourceWarning``.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        """The inotify descriptor; -1 once closed."""

    async def changed(self) -> None:
        """Wait until something in the directory changed, then drain the pending events."""
        await anyio.wait_readable(self.fd)
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self.fd, 65536):
                pass

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        if self.fd >= 0:
            fd = self.fd
            self.close()
            warnings.warn(f"unclosed inotify watch (fd {fd})", ResourceWarning, stacklevel=1)


def open_watch(directory: str) -> DirectoryWatch | None:
    """Watch ``directory``; None when inotify is unavailable or the directory is missing."""
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        log.info("inotify unavailable (errno %d); polling %s", ctypes.get_errno(), directory)
        return None
    if libc.inotify_add_watch(fd, os.fsencode(directory), _MASK) < 0:
        log.info("cannot watch %s (errno %d); polling it", directory, ctypes.get_errno())
        os.close(fd)
        return None
    return DirectoryWatch(fd)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
        _ = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


@contextlib.contextmanager
def watching(directory: str) -> Iterator[DirectoryWatch | None]:
    watch = open_watch(directory)
    try:
        yield watch
    finally:
        if watch is not None:
            watch.close()

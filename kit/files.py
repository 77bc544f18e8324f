"""Files a process reads and keeps on its node: read bounded, written whole or not at all.

Reading (:func:`read_capped`): an input named by a flag or found on disk (a profile, a policy,
a kubeconfig, a context) is read only when it is a regular file, and only up to a cap: a path
such as ``/dev/zero`` or a FIFO, or a file of gigabytes, is refused with a reason instead of
filling memory or blocking. Failures say why in words (:func:`reason`), never a bare errno.

Writing: a crash (or a node losing power) mid-write leaves the previous version, never a torn
one, and the file is private to the process's user: it records what a node serves, nobody
else's read.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

__all__ = [
    "INPUT_BYTES",
    "SOCKET_PATH_BYTES",
    "InputRefused",
    "read_capped",
    "reason",
    "socket_directory",
    "socket_path",
    "unique_file",
    "writable_directory",
    "writable_file",
    "write_atomically",
    "write_private",
]

INPUT_BYTES: Final = 4 * 1024 * 1024
"""The default cap on a configuration file (a profile, policy, kubeconfig: kilobytes in practice)."""

_REASONS: Final = {
    errno.ENOENT: "does not exist",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EISDIR: "is a directory",
    errno.EROFS: "is on a read-only file system",
    errno.ELOOP: "has too many levels of symbolic links",
    errno.ENAMETOOLONG: "the name is too long",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EIO: "an I/O error on the device",
    errno.EEXIST: "already exists",
    errno.EMFILE: "this process has too many open files",
}


class InputRefused(Exception):
    """A file input that cannot be used: missing, not a regular file, too large, unreadable.
    The text is ``<path>: <reason>``; the caller names its flag in front of it. ``missing``:
    the path does not exist (callers for which that is normal tell it apart)."""

    def __init__(self, text: str, *, missing: bool = False) -> None:
        super().__init__(text)
        self.missing = missing


def reason(error: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """``error`` in words about ``path`` (its own file name when None): what a person can act on.

    ``ENOSPC`` names the device by the path it holds, as ``df <path>`` would find it.
    """
    where = str(path if path is not None else (error.filename or "")) or "the path"
    if error.errno == errno.ENOSPC:
        return f"no space left on the device holding {where}"
    text = _REASONS.get(error.errno or 0)
    if text is None:
        text = (error.strerror or str(error)).lower()
    return f"{where}: {text}"


def read_capped(path: str | os.PathLike[str], *, limit: int = INPUT_BYTES) -> bytes:
    """The whole of ``path`` when it is a regular file of at most ``limit`` bytes.

    Opened non-blocking (a FIFO does not wait for a writer), checked on the open descriptor
    (no race with a rename), and read to ``limit + 1`` bytes at most, so a file that grows, or
    reports no size (``/proc``), is refused rather than read for ever.

    :raises InputRefused: missing, unreadable, not a regular file, or larger than ``limit``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise InputRefused(reason(e, path), missing=e.errno == errno.ENOENT) from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise InputRefused(f"{path}: {kind}")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise InputRefused(reason(e, path)) from e
    finally:
        os.close(fd)
    if size > limit:
        raise InputRefused(f"{path}: larger than {limit // 1024} KiB, the most read")
    return b"".join(chunks)


def writable_directory(path: str | os.PathLike[str]) -> None:
    """Make ``path`` (and its parents) if missing, and prove a file can be made in it.

    A probe, not :func:`os.access`: root passes every permission check, yet cannot create a
    file under ``/proc/self`` or on a read-only or full file system.

    :raises InputRefused: with the reason.
    """
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        fd, name = unique_file(Path(path), ".probe-", "")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise InputRefused(reason(e, path)) from e


SOCKET_PATH_BYTES: Final = 107
"""The longest path a unix socket can be bound or reached at: Linux's ``sun_path`` has 108
bytes and libuv (uvloop) keeps one for the terminating NUL."""


def socket_path(path: str | os.PathLike[str]) -> None:
    """``path`` fits a unix socket's address (checked before a bind, which would only say
    "AF_UNIX path too long", without the path).

    :raises InputRefused: with the path and its length.
    """
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_BYTES:
        raise InputRefused(
            f"{os.fspath(path)}: a unix socket path of {size} bytes; at most {SOCKET_PATH_BYTES} "
            "fit, so its directory must be shorter"
        )


def socket_directory(path: str | os.PathLike[str]) -> None:
    """A unix socket can be made at ``path``: the path fits (:func:`socket_path`) and its
    directory exists (the socket itself may come later: its server makes it).

    :raises InputRefused: with the reason.
    """
    socket_path(path)
    parent = Path(path).parent
    try:
        if not stat.S_ISDIR(os.stat(parent).st_mode):
            raise InputRefused(f"{parent}: not a directory")
    except OSError as e:
        raise InputRefused(reason(e, parent)) from e


def writable_file(path: str | os.PathLike[str]) -> None:
    """Prove ``path`` can be opened for appending (created empty when missing; its directory
    must exist): a log that will be written for the whole run.

    :raises InputRefused: with the reason.
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError as e:
        raise InputRefused(reason(e, path)) from e


def unique_file(directory: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """A new file in ``directory`` named ``prefix`` + random + ``suffix``, created exclusively
    (mode 0600): its descriptor and path, as :func:`tempfile.mkstemp` gives them.

    Our own because importing :mod:`tempfile` (with :mod:`shutil`, :mod:`random` and the
    compression modules behind them) cost every command that writes a file several ms of its
    start-up. 48 random bits a name; a name taken already is drawn again.

    :raises OSError: the directory refuses the file (``FileExistsError`` only after 100 draws).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        name = os.path.join(directory, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            return os.open(name, flags, 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no unused temporary name in {directory}")


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (mode 0600), durable when this returns; the directory is
    created (0700) when missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(path, data, mode=0o600)


def write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    """Replace ``path`` with ``data`` (``mode``): never a torn file, durable when this returns.

    The temporary file is unique to this call (:func:`unique_file`), so threads writing one
    file at once cannot rename each other's file away; it is removed when the write fails. The
    directory is fsynced after the rename, so the new name survives a power loss too.
    """
    fd, name = unique_file(path.parent, f".{path.name}.", ".tmp")
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

"""The host side of an injection: per-allocation work directories and the files in them.

A sliced container mounts a directory of its own under ``host_work_dir``
(:func:`responders.work_dir`), where the slicing runtime reads a few small files. The node makes
them before Allocate answers and removes them when the allocation is released, or at once when
its Allocate is refused: a ``mkdir``, a short write and an ``rmtree`` of a near-empty directory,
cheap enough to run on the event loop. Directories are writable, and files readable, by any
user: the container may not run as root. Nothing here decides; failures name the path.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence

from agent.deviceplugin import errors, responders
from agent.deviceplugin.injection import HostFile

__all__ = ["make_dirs", "remove", "write_files"]

log = logging.getLogger(__name__)


def make_dirs(paths: Sequence[str]) -> None:
    """Create each directory, writable by any user.

    :raises errors.CannotInject: naming the directory that could not be made.
    """
    for path in paths:
        try:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o777)  # private to one container, whatever user it runs as
        except OSError as e:
            raise errors.CannotInject(f"cannot create the work directory {path}: {e}") from e


def write_files(files: Sequence[HostFile]) -> None:
    """Write each file, world-readable.

    :raises errors.CannotInject: naming the file that could not be written.
    """
    for file in files:
        try:
            with open(file.path, "w", encoding="utf-8") as f:
                f.write(file.content)
            os.chmod(file.path, 0o644)
        except OSError as e:
            raise errors.CannotInject(f"cannot write {file.path}: {e}") from e


def remove(host_work_dir: str, allocation_id: str) -> None:
    """Remove the work directory of ``allocation_id`` if there is one; a failure is logged
    (a released allocation must not stay charged because of a leftover file)."""
    path = responders.work_dir(host_work_dir, allocation_id)
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path):
            log.warning("cannot remove the work directory %s of %s", path, allocation_id)

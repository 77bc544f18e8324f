"""Side effects on the host, each bounded: the preload tree, the lock, scratch, driver modes.

- The preload tree is copied from this image's copy (``lib_source/<manufacturer>``) to
  ``/var/lib/gpustack/operator/lib/<manufacturer>`` under the host root, replacing files and
  never removing any (a device plugin may be mounting them right now).
- The lock is an exclusive ``flock`` on ``/var/lib/gpustack/operator/preflight/lock``: a second
  run fails to take it at once and reports every row unavailable.
- Scratch (everything under the preflight directory but the lock) is removed at the end.
- A driver mode switched on to test it is switched back whatever happens (:func:`driver_mode`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from agent.errors import AgentError
from agent.preflight.injection import Injection
from agent.preflight.settings import HOST_LIB_DIR, SCRATCH_DIR


class StagingError(AgentError):
    """The preload tree could not be laid out on the host; the message names the file."""


class Locked(AgentError):
    """Another preflight holds the lock."""


@dataclass(frozen=True)
class Step:
    """Copy ``source`` (in this image) to ``target`` (a host path); write ``content`` there
    when given (a file a responder renders); else mkdir."""

    target: str
    source: str = ""
    content: str | None = None

    def describe(self) -> str:
        if self.source:
            return f"copy {self.source} to {self.target}"
        if self.content is not None:
            return f"write {self.target}"
        return f"create directory {self.target}"


def plan_staging(
    manufacturer: str, injections: Sequence[Injection], lib_source: str
) -> tuple[list[Step], list[str]]:
    """The steps that make every host path the injections mount exist, and what is missing.

    The whole ``lib_source/<manufacturer>`` tree is copied; a mounted library path the image
    does not carry is reported missing. A writable mount outside the library tree (HAMi's lock
    directory, the per-allocation work directory) is created as a directory.
    """
    tree = os.path.join(lib_source, manufacturer)
    steps = [
        Step(os.path.join(HOST_LIB_DIR, manufacturer, rel), os.path.join(tree, rel))
        for rel in _files(tree)
    ]
    targets = {s.target for s in steps}
    missing: list[str] = []
    for injection in injections:
        for mount in sorted(injection.mounts):
            host_path = mount.host_path
            if host_path.startswith(HOST_LIB_DIR + "/"):
                if host_path not in targets and host_path not in missing:
                    missing.append(host_path)
            elif not mount.read_only and not host_path.startswith("/dev/"):
                step = Step(host_path)
                if step not in steps:
                    steps.append(step)
        for rendered in [*map(Step, injection.host_dirs),
                         *(Step(f.path, content=f.content) for f in injection.files)]:  # fmt: skip
            if rendered not in steps:
                steps.append(rendered)
    return steps, missing


def _files(tree: str) -> list[str]:
    found: list[str] = []
    for directory, _, names in os.walk(tree):
        found += [os.path.relpath(os.path.join(directory, n), tree) for n in names]
    return sorted(found)


def apply(steps: Sequence[Step], host_root: str) -> None:
    """:raises StagingError: naming the step that failed (earlier steps stay done)."""
    for step in steps:
        target = os.path.join(host_root, step.target.lstrip("/"))
        try:
            if step.source:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                tmp = target + ".preflight-tmp"
                shutil.copy2(step.source, tmp)
                os.replace(tmp, target)  # atomic: a reader sees old or new, never half
            elif step.content is not None:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "w", encoding="utf-8") as f:
                    f.write(step.content)
            else:
                os.makedirs(target, exist_ok=True)
        except OSError as e:
            raise StagingError(f"{step.describe()}: {e}") from e


@contextmanager
def locked(host_root: str) -> Iterator[str]:
    """Hold the preflight lock; yields its host path.

    :raises Locked: when another process holds it. :raises StagingError: when it cannot be made.
    """
    path = os.path.join(SCRATCH_DIR, "lock")
    local = os.path.join(host_root, path.lstrip("/"))
    try:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        fd = os.open(local, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StagingError(f"cannot open the lock {path}: {e}") from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise Locked(f"another preflight holds {path}") from e
        try:
            yield path
        finally:
            _clear_scratch(os.path.dirname(local))
    finally:
        os.close(fd)


def _clear_scratch(directory: str) -> None:
    for name in os.listdir(directory):
        if name == "lock":
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


@contextmanager
def driver_mode(
    read: Callable[[], bool], write: Callable[[bool], None], wanted: bool = True
) -> Iterator[bool]:
    """Switch a driver mode to ``wanted`` for the block, and back to what it was either way.

    Yields the mode it found. Nothing is written when it already is ``wanted``. No NVIDIA or AMD
    capability needs a toggle; Ascend's container-share and Cambricon's sMLU mode will.
    """
    before = read()
    if before != wanted:
        write(wanted)
    try:
        yield before
    finally:
        if before != wanted:
            write(before)

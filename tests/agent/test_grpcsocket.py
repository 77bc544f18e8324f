"""``agent.grpcsocket.unix_server`` against grpcio (C-core) clients, on both event loops.

The agents serve the device plugins and the CSI driver on uvloop, and the server must hold on
asyncio too (tests/conftest.py, ``every_loop``), so every test runs on both. Cancellation is exercised on purpose: before, during and after the bind, and at
several delays while serving; each time nothing may be left (socket file, descriptor, task).
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import grpc
import pytest
from grpclib.server import Server

from agent import grpcsocket
from agent.testing import unary
from bus.testing import eventually
from proto.deviceplugin import v1beta1 as dp

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

OPTIONS = "/v1beta1.DevicePlugin/GetDevicePluginOptions"
LIST_AND_WATCH = "/v1beta1.DevicePlugin/ListAndWatch"


class _Plugin(dp.DevicePluginBase):
    """Answers GetDevicePluginOptions; ListAndWatch sends one list, then waits forever."""

    async def get_device_plugin_options(self, empty: dp.Empty) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def list_and_watch(self, empty: dp.Empty) -> AsyncIterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(devices=[dp.Device(id="GPU-1", health="Healthy")])
        await anyio.sleep_forever()


async def _options(path: Path) -> dp.DevicePluginOptions:
    return await anyio.to_thread.run_sync(
        unary, path, OPTIONS, dp.Empty(), dp.DevicePluginOptions.FromString
    )


def _fds() -> frozenset[tuple[str, str]]:
    """Open descriptors, each with what it points at (a socket's inode tells two apart).

    A set, not a count: another test's leftovers closed by the collector during this test
    must not hide a descriptor this one leaked.
    """
    opened = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            opened.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # closed since the listing (the listing's own descriptor among them)
            continue
    return frozenset(opened)


async def _baseline(tmp_path: Path) -> tuple[frozenset[tuple[str, str]], int]:
    """Open descriptors and tasks once this event loop has listened on a socket.

    libuv (uvloop) keeps one descriptor per loop from its first listen on, in reserve for
    running out of descriptors; it belongs to the loop, not to any server.
    """
    async with grpcsocket.unix_server(tmp_path / "warm.sock", [_Plugin()]):
        pass
    return _fds(), _tasks()


def _tasks() -> int:
    return len(asyncio.all_tasks())


@contextmanager
def _foreign_socket(path: Path) -> Iterator[socket.socket]:
    """A socket somebody else bound at ``path`` (not listening: it only has to exist)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        yield sock
    finally:
        sock.close()


async def _until(condition: Callable[[], bool]) -> None:
    async def check() -> bool:
        return condition()

    await eventually(check)


async def test_serves_grpcio_with_the_mode_and_removes_the_socket(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    async with grpcsocket.unix_server(path, [_Plugin()]) as bound:
        options = await _options(path)
        mode = os.stat(path).st_mode
        assert bound.intact()
        assert bound.identity == grpcsocket.socket_identity(path)

    assert options.get_preferred_allocation_available
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert not path.exists()


async def test_the_mode_is_the_callers(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    async with grpcsocket.unix_server(path, [_Plugin()], mode=0o660):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660


async def test_a_stale_socket_is_replaced_and_anything_else_refused(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    with _foreign_socket(stale):
        pass  # closed without unlinking: what a crashed run leaves
    async with grpcsocket.unix_server(stale, [_Plugin()]):
        assert (await _options(stale)).get_preferred_allocation_available

    regular = tmp_path / "file.sock"
    regular.write_text("not a socket")
    with pytest.raises(OSError):
        async with grpcsocket.unix_server(regular, [_Plugin()]):
            pytest.fail("bound over a regular file")
    assert regular.read_text() == "not a socket"


def _connect_and_leave(path: Path, times: int) -> None:
    """``times`` grpcio channels in turn, each on its own connection: one call, then closed."""
    for _ in range(times):
        options = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(f"unix:{path}", options=options) as channel:
            call = channel.unary_unary(
                OPTIONS,
                request_serializer=bytes,
                response_deserializer=dp.DevicePluginOptions.FromString,
            )
            call(dp.Empty(), timeout=5)


async def test_closed_connections_are_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    async with grpcsocket.unix_server(path, [_Plugin()]) as bound:
        await anyio.to_thread.run_sync(_connect_and_leave, path, 200)

        await _until(lambda: len(bound.connections) == 0)
        assert bound.connections.accepted >= 200


async def test_a_replacement_socket_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    with _foreign_socket(tmp_path / "other.sock"):
        async with grpcsocket.unix_server(path, [_Plugin()]) as bound:
            # Somebody else's socket takes the path over (bound while ours still existed, so
            # it cannot reuse our inode): what kubelet's restart plus another binder looks like.
            os.rename(tmp_path / "other.sock", path)
            replacement = grpcsocket.socket_identity(path)
            assert not bound.intact()

        assert replacement is not None
        assert grpcsocket.socket_identity(path) == replacement


async def test_a_vanished_socket_is_no_error(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    async with grpcsocket.unix_server(path, [_Plugin()]) as bound:
        path.unlink()
        assert not bound.intact()
    assert not path.exists()


class _Stream:
    """A ListAndWatch call read in a thread until it ends; ``code`` is how it ended."""

    def __init__(self, path: Path) -> None:
        self.updates = 0
        self.code: grpc.StatusCode | None = None
        self._channel = grpc.insecure_channel(f"unix:{path}")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        stream = self._channel.unary_stream(
            LIST_AND_WATCH,
            request_serializer=bytes,
            response_deserializer=dp.ListAndWatchResponse.FromString,
        )
        try:
            for _ in stream(dp.Empty(), timeout=30):
                self.updates += 1
        except grpc.RpcError as e:
            self.code = e.code()
        finally:
            self._channel.close()

    def ended(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


async def test_leaving_ends_open_streams_promptly(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    async with grpcsocket.unix_server(path, [_Plugin()]) as bound:
        stream = _Stream(path)
        await _until(lambda: stream.updates == 1)
        assert len(bound.connections) == 1
        started = time.monotonic()
    took = time.monotonic() - started

    assert await anyio.to_thread.run_sync(stream.ended, 10.0)
    assert stream.code not in (None, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert len(bound.connections) == 0
    assert took < 2.0


async def _cancel_after(scope: anyio.CancelScope, turns: int) -> None:
    for _ in range(turns):
        await anyio.lowlevel.checkpoint()
    scope.cancel()


@pytest.mark.parametrize("turns", range(6))
async def test_a_start_cancelled_at_any_turn_leaves_nothing(tmp_path: Path, turns: int) -> None:
    path = tmp_path / "p.sock"
    fds, tasks = await _baseline(tmp_path)
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:
            tg.start_soon(_cancel_after, scope, turns)
            async with grpcsocket.unix_server(path, [_Plugin()]):
                await anyio.sleep_forever()

    assert scope.cancelled_caught
    assert not path.exists()
    assert (_fds() - fds, _tasks()) == (set(), tasks)


async def test_a_start_cancelled_before_it_began_binds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: list[object] = []
    monkeypatch.setattr(Server, "start", lambda *a, **kw: starts.append(a))
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with grpcsocket.unix_server(tmp_path / "p.sock", [_Plugin()]):
            pytest.fail("the body ran although the start was cancelled")

    assert scope.cancelled_caught
    assert starts == []


async def test_a_cancel_inside_the_bind_waits_for_it_then_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel arrives while the event loop is binding: the bind finishes, then unwinds."""
    path = tmp_path / "p.sock"
    fds, tasks = await _baseline(tmp_path)
    start = Server.start
    finished: list[bool] = []

    async def start_then_cancel(self: Server, **kw: Any) -> None:
        await start(self, **kw)
        scope.cancel()
        await anyio.lowlevel.checkpoint()  # still inside the bind
        finished.append(True)

    monkeypatch.setattr(Server, "start", start_then_cancel)
    with anyio.CancelScope() as scope:
        async with grpcsocket.unix_server(path, [_Plugin()]):
            pytest.fail("the body ran although the start was cancelled")

    assert finished == [True]
    assert scope.cancelled_caught
    assert not path.exists()
    assert (_fds() - fds, _tasks()) == (set(), tasks)


def _closed_by_peer(client: socket.socket) -> bool:
    """Read until the server's end is gone; False if it is still open after 5 s."""
    client.settimeout(5)
    try:
        while client.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("delay_s", [0, 0.001, 0.01, 0.05])
async def test_a_cancel_while_serving_closes_every_connection(
    tmp_path: Path, delay_s: float
) -> None:
    path = tmp_path / "p.sock"
    fds, tasks = await _baseline(tmp_path)
    clients: list[socket.socket] = []
    with anyio.CancelScope() as scope:
        async with grpcsocket.unix_server(path, [_Plugin()]) as bound:
            for _ in range(3):
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                clients.append(client)
                client.connect(str(path))
            scope.deadline = anyio.current_time() + delay_s  # accepted or not yet, by then
            await anyio.sleep_forever()

    assert scope.cancelled_caught
    assert not path.exists()
    assert len(bound.connections) == 0
    assert [await anyio.to_thread.run_sync(_closed_by_peer, c) for c in clients] == [True] * 3
    for client in clients:
        client.close()
    assert (_fds() - fds, _tasks()) == (set(), tasks)


def _raw_connects(path: Path, count: int) -> None:
    """Connections closed abruptly: some send half an HTTP/2 preface, some nothing at all."""
    for i in range(count):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(str(path))
            if i % 2:
                raw.sendall(b"PRI * HTTP/2.0\r\n")


async def test_abruptly_closed_raw_connections_are_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    async with grpcsocket.unix_server(path, [_Plugin()]) as bound:
        fds = _fds()
        await anyio.to_thread.run_sync(_raw_connects, path, 500)

        await _until(lambda: len(bound.connections) == 0)
        await _until(lambda: _fds() <= fds)
        assert bound.connections.accepted >= 500
        await _options(path)  # still serving


def _path_of(directory: Path, size: int) -> Path:
    """A socket path of exactly ``size`` bytes under ``directory`` (made here)."""
    name_size = size - len(os.fsencode(directory)) - 1
    assert name_size > 0
    return directory / ("s" * name_size)


async def test_the_longest_path_a_unix_socket_takes_is_bound_and_served(
    short_tmp_path: Path,
) -> None:
    path = _path_of(short_tmp_path, 107)
    async with grpcsocket.unix_server(path, [_Plugin()]):
        options = await _options(path)  # grpcio (C-core) reaches it at that address
    assert options.get_preferred_allocation_available


async def test_a_path_one_byte_longer_is_refused_naming_it_and_touches_nothing(
    short_tmp_path: Path,
) -> None:
    path = _path_of(short_tmp_path, 108)
    fds, tasks = await _baseline(short_tmp_path)
    with pytest.raises(grpcsocket.SocketPathTooLong) as caught:
        async with grpcsocket.unix_server(path, [_Plugin()]):
            pytest.fail("bound a path the kernel cannot take whole")
    assert str(caught.value) == (
        f"{path}: a unix socket path of 108 bytes; at most 107 fit, so its directory must be "
        "shorter"
    )
    assert not path.exists()
    assert (_fds() - fds, _tasks()) == (set(), tasks)

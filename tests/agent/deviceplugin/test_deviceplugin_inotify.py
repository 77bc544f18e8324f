"""The inotify reader on its own, its fallbacks, and the restart it lets registration notice."""

from __future__ import annotations

import ctypes
import gc
import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from deviceplugin_harness import NVIDIA

from agent.deviceplugin import inotify
from agent.deviceplugin.running import device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from agent.testing import FakeKubelet
from bus import devices
from bus.testing import eventually

pytestmark = pytest.mark.every_loop  # I/O of its own (tests/conftest.py)

BOUND_S = 5.0
"""How long an event may take to arrive before the test fails (a bound, not a speed claim)."""


def _inotify_fds() -> int:
    """Open inotify descriptors of this process."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            pass  # the descriptor listdir itself used, closed by now
    return count


@contextmanager
def _unix_socket(path: Path) -> Iterator[None]:
    """A bound unix socket file at ``path``, as kubelet and the plugins create them."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        yield
    finally:
        sock.close()


def _drained(watch: inotify.DirectoryWatch) -> bool:
    """Whether no event is pending (so :meth:`changed` consumed all it woke for)."""
    try:
        os.read(watch.fd, 65536)
    except BlockingIOError:
        return True
    return False


@pytest.mark.anyio
async def test_creating_and_deleting_a_socket_wakes_the_watch(tmp_path: Path) -> None:
    watch = inotify.open_watch(str(tmp_path))
    assert watch is not None
    try:
        with _unix_socket(tmp_path / "kubelet.sock"):
            with anyio.fail_after(BOUND_S):
                await watch.changed()
            assert _drained(watch)

            (tmp_path / "kubelet.sock").unlink()
            with anyio.fail_after(BOUND_S):
                await watch.changed()
            assert _drained(watch)

        staged = tmp_path / "staged"
        staged.write_bytes(b"")
        with anyio.fail_after(BOUND_S):
            await watch.changed()
        assert _drained(watch)
        staged.rename(tmp_path / "moved.sock")  # how some tools publish a socket
        with anyio.fail_after(BOUND_S):
            await watch.changed()
        assert _drained(watch)
    finally:
        watch.close()


def test_changes_elsewhere_queue_nothing(tmp_path: Path) -> None:
    (tmp_path / "watched").mkdir()
    (tmp_path / "elsewhere").mkdir()
    with inotify.watching(str(tmp_path / "watched")) as watch:
        assert watch is not None
        with _unix_socket(tmp_path / "elsewhere" / "kubelet.sock"):
            assert _drained(watch)  # the kernel queues an event within the bind call
        with _unix_socket(tmp_path / "watched" / "kubelet.sock"):
            assert not _drained(watch)


def test_without_inotify_there_is_no_watch_and_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inotify, "_libc", lambda: None)

    assert inotify.open_watch(str(tmp_path)) is None
    with inotify.watching(str(tmp_path)) as watch:
        assert watch is None


@pytest.mark.parametrize(
    "cdll",
    [
        pytest.param(lambda *a, **kw: object(), id="libc-without-inotify"),
        pytest.param(lambda *a, **kw: (_ for _ in ()).throw(OSError("no libc")), id="no-libc"),
    ],
)
def test_a_libc_without_inotify_is_no_inotify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cdll: object
) -> None:
    monkeypatch.setattr(ctypes, "CDLL", cdll)

    assert inotify._libc() is None
    assert inotify.open_watch(str(tmp_path)) is None


def test_a_refused_inotify_instance_falls_back_to_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def init1(flags: int) -> int:
        return -1  # EMFILE: the per-user instance limit is reached

    def add_watch(fd: int, path: bytes, mask: int) -> int:
        raise AssertionError("no watch without an instance")

    refusing = SimpleNamespace(inotify_init1=init1, inotify_add_watch=add_watch)
    monkeypatch.setattr(inotify, "_libc", lambda: refusing)

    with caplog.at_level("INFO", logger=inotify.__name__):
        assert inotify.open_watch(str(tmp_path)) is None
    assert f"polling {tmp_path}" in caplog.text


def test_a_missing_directory_gives_no_watch_and_keeps_no_descriptor(tmp_path: Path) -> None:
    before = _inotify_fds()

    assert inotify.open_watch(str(tmp_path / "absent")) is None
    assert _inotify_fds() == before


def test_closing_releases_the_descriptor_once(tmp_path: Path) -> None:
    before = _inotify_fds()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        with inotify.watching(str(tmp_path)) as watch:
            assert watch is not None
            assert _inotify_fds() == before + 1
        assert _inotify_fds() == before
        assert watch.fd == -1

        other = inotify.open_watch(str(tmp_path))  # may reuse the closed number
        assert other is not None
        watch.close()  # a second close must not close the reused number
        assert _inotify_fds() == before + 1
        other.close()
        del watch, other
        gc.collect()
    assert _inotify_fds() == before


def _abandon(directory: Path) -> None:
    assert inotify.open_watch(str(directory)) is not None  # collected as the statement ends


def test_a_watch_left_open_is_closed_with_a_resource_warning(tmp_path: Path) -> None:
    before = _inotify_fds()

    with pytest.warns(ResourceWarning, match="unclosed inotify watch"):
        _abandon(tmp_path)
    assert _inotify_fds() == before


# ------------------------------------------------------------------ registration


async def _async(value: bool) -> bool:
    return value


@pytest.mark.anyio
async def test_only_inotify_notices_a_kubelet_restart_when_the_level_check_is_far_off(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    """With the periodic check 30 s away and no update, the restart can only be seen through
    inotify: the sockets come back and every server registers with the new kubelet within the
    10 s the test waits."""
    settings = DevicePluginSettings.for_tests(str(tmp_path), register_retry_s=30.0)
    async with device_plugins(settings, publish=lambda e: None) as plugins:
        plugins.update(h200)  # the last wake-up that is not inotify's
        await kubelet.registered_all(NVIDIA, times=1)
        assert len(kubelet.plugin_sockets()) == 5
        # every reply in before the restart, or one is retried and counted once, not twice
        await eventually(lambda: _async(plugins.registrations == 5))

        kubelet.restart()

        await kubelet.registered_all(NVIDIA, times=2)
        await eventually(lambda: _async(len(kubelet.plugin_sockets()) == 5))
        await eventually(lambda: _async(plugins.registrations == 10))


@pytest.mark.anyio
async def test_without_inotify_the_level_check_still_reregisters(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h200: list[devices.DeviceGroup],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inotify, "_libc", lambda: None)
    settings = DevicePluginSettings.for_tests(str(tmp_path), register_retry_s=0.1)
    async with device_plugins(settings, publish=lambda e: None) as plugins:
        plugins.update(h200)
        await kubelet.registered_all(NVIDIA, times=1)
        kubelet.restart()

        await kubelet.registered_all(NVIDIA, times=2)
        await eventually(lambda: _async(len(kubelet.plugin_sockets()) == 5))
    assert kubelet.plugin_sockets() == []

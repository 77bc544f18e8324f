"""XID events: the NVML adapter's event calls, the simulator behind them, and the watcher."""

from __future__ import annotations

import threading

import anyio
import msgspec
import pytest

from agent.devices.libs import nvml
from agent.devices.simulation import fakenvml, profiles
from agent.serve import watching

pytestmark = pytest.mark.every_loop  # I/O of its own (tests/conftest.py)


def _library(**card_overrides: object) -> fakenvml.SimulatedNvml:
    host = profiles.load("nvidia-h200x8").nvidia
    assert host is not None
    cards = tuple(
        c if i else msgspec.structs.replace(c, **card_overrides)
        for i, c in enumerate(host.cards[:2])
    )
    return fakenvml.SimulatedNvml(msgspec.structs.replace(host, cards=cards))


def _registered(adapter: nvml.Nvml) -> object:
    event_set = adapter.event_set_create()
    for index in range(adapter.device_count()):
        adapter.register_xid_events(adapter.handle(index), event_set)
    return event_set


def test_profile_xids_then_injected_xids_arrive_in_order() -> None:
    library = _library(xids=(31, 79))
    adapter = nvml.Nvml(library)
    with adapter.session():
        event_set = _registered(adapter)
        library.inject_xid(1, 48)
        got = [adapter.wait_xid(event_set, 10) for _ in range(4)]
        adapter.event_set_free(event_set)

    seen = [(adapter_uuid(library, e.handle), e.xid) if e else None for e in got]
    cards = library.cards
    assert seen == [(cards[0].uuid, 31), (cards[0].uuid, 79), (cards[1].uuid, 48), None]
    assert adapter.errors_by_call == {}  # a timeout is not an error


def adapter_uuid(library: fakenvml.SimulatedNvml, handle: fakenvml.SimulatedHandle) -> str:
    return library.cards[handle.index].uuid


def test_a_waiting_thread_wakes_on_injection() -> None:
    library = _library()
    adapter = nvml.Nvml(library)
    with adapter.session():
        event_set = _registered(adapter)
        timer = threading.Timer(0.05, library.inject_xid, (0, 62))
        timer.start()
        event = adapter.wait_xid(event_set, 5000)
        timer.join()
        adapter.event_set_free(event_set)

    assert event is not None and event.xid == 62


def test_a_lost_card_fails_the_wait_once_and_refuses_registration() -> None:
    library = _library()
    adapter = nvml.Nvml(library)
    with adapter.session():
        event_set = _registered(adapter)
        library.lose(1)
        with pytest.raises(nvml.NvmlGpuLost):
            adapter.wait_xid(event_set, 10)
        assert adapter.wait_xid(event_set, 10) is None
        with pytest.raises(nvml.NvmlGpuLost):
            adapter.register_xid_events(fakenvml.SimulatedHandle(1), event_set)
        adapter.event_set_free(event_set)

    assert adapter.errors_by_call["nvmlEventSetWait"] == 1


def test_event_calls_need_init_and_map_errors() -> None:
    adapter = nvml.Nvml(_library())

    with pytest.raises(nvml.NvmlCallFailed) as caught:
        adapter.event_set_create()

    assert caught.value.code_name == "UNINITIALIZED"


def test_a_binding_without_events_is_unsupported() -> None:
    class Old:
        NVMLError = fakenvml.NVMLError

    adapter = nvml.Nvml(Old())

    with pytest.raises(nvml.NvmlUnsupported):
        adapter.wait_xid(object(), 10)


@pytest.mark.anyio
async def test_watcher_delivers_xids_and_closes_its_session_when_cancelled() -> None:
    library = _library(xids=(13,))
    adapter = nvml.Nvml(library)
    got: list[tuple[str, int]] = []
    arrived = anyio.Event()

    def on_xid(uuid: str, xid: int) -> None:
        got.append((uuid, xid))
        if len(got) == 2:
            arrived.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: watching.watch_xids(
                adapter, on_xid=on_xid, on_failure=lambda: None, wait_s=0.02, retry_s=0.05
            )
        )
        library.inject_xid(1, 79)
        with anyio.fail_after(5):
            await arrived.wait()
        tg.cancel_scope.cancel()

    assert got == [(library.cards[0].uuid, 13), (library.cards[1].uuid, 79)]
    assert library.refcount == 0


@pytest.mark.anyio
async def test_watcher_reports_a_failed_wait_and_reopens() -> None:
    library = _library()
    adapter = nvml.Nvml(library)
    failures = anyio.Event()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: watching.watch_xids(
                adapter,
                on_xid=lambda u, x: None,
                on_failure=failures.set,
                wait_s=0.02,
                retry_s=0.02,
            )
        )
        await anyio.sleep(0.05)
        library.lose(0)
        with anyio.fail_after(5):
            await failures.wait()
        tg.cancel_scope.cancel()

    assert library.refcount == 0
    assert ("nvmlEventSetFree", None) in library.calls


@pytest.mark.anyio
async def test_watcher_without_nvml_retries_quietly() -> None:
    adapter = nvml.Nvml(fakenvml.SimulatedNvml(None))

    with anyio.move_on_after(0.1):
        await watching.watch_xids(
            adapter, on_xid=lambda u, x: None, on_failure=lambda: None, wait_s=0.01, retry_s=0.02
        )

    assert [c for c in adapter.library.calls if c[0] == "nvmlInit"]

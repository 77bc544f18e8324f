"""The dashboard server against a real nats-server and a real HTTP client: the page, and the
event feed (status, the retained state replayed, then live events)."""

from __future__ import annotations

import functools
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import anyio
import msgspec
import pytest

from bus import connection, publishing, testing
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from gpustack_operator.dashboard import serving
from gpustack_operator.dashboard.feed import Feed
from gpustack_operator.main import options_for
from kit import testing as testing_servers
from kit.options import SettingsError
from kit.serving import ServingFailed

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

STATIC = Path(serving.__file__).parent / "static"


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[BusSettings]:
    async with testing.nats_server(tmp_path) as server:
        yield testing.settings_for(server)


async def _frames(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, object]]:
    """Server-sent events as (name, decoded data), read as a browser's EventSource would."""
    name, data = "message", b""
    async for line in response.content:
        line = line.rstrip(b"\r\n")
        if not line:
            if data:
                yield name, msgspec.json.decode(data)
            name, data = "message", b""
        elif line.startswith(b"event: "):
            name = line[len(b"event: ") :].decode()
        elif line.startswith(b"data: "):
            data += line[len(b"data: ") :]


async def _until(frames: AsyncIterator[tuple[str, object]], last: str) -> list[tuple[str, object]]:
    seen = []
    with anyio.fail_after(15):
        async for name, data in frames:
            seen.append((name, data))
            if name == last:
                return seen
    raise AssertionError(f"the stream ended before {last!r}: {seen}")


async def test_a_page_gets_the_retained_state_then_live_events(bus: BusSettings) -> None:
    settings = serving.DashboardSettings(bus=bus, status_period_s=0.2)
    async with (
        connection.connect(bus) as conn,
        publishing.publisher(conn, settings=bus, metrics=BusMetrics()) as pub,
    ):
        for node in ("a.one", "b.two"):
            for ev in testing.example_events(node):
                pub.publish(ev)
        await pub.wait_sent()
        async with anyio.create_task_group() as tg:
            url = await tg.start(functools.partial(serving.serve, settings))
            async with aiohttp.ClientSession() as session:
                await _until_replayed(session, url, nodes=2)
                async with session.get(url + "events") as response:
                    assert response.headers["Content-Type"] == "text/event-stream"
                    frames = _frames(response)
                    opened = await _until(frames, "ready")
                    assert [n for n, _ in opened[:2]] == ["status", "reset"]
                    replayed = [d for n, d in opened if n == "bus"]
                    assert {(d["node"], d["kind"]) for d in replayed} == {  # type: ignore[index]
                        (n, k)
                        for n in ("a.one", "b.two")
                        for k in ("devices", "samples", "health", "allocations", "models", "agent")
                    }
                    pub.publish(testing.example_events("a.one", seq=7)[5])  # live
                    live = await _until(frames, "bus")
                    assert live[-1][1]["version"] == "0.1.7"  # type: ignore[index]
                    status = await _until(frames, "status")
                    assert status[-1][1]["connected"] is True  # type: ignore[index]
            tg.cancel_scope.cancel()


async def _until_replayed(session: aiohttp.ClientSession, url: str, *, nodes: int) -> None:
    """Wait until the server's own subscription has read the state of ``nodes`` nodes."""

    async def replayed() -> bool:
        async with session.get(url + "events") as response:
            seen = await _until(_frames(response), "ready")
        return len({d["node"] for n, d in seen if n == "bus"}) >= nodes  # type: ignore[index]

    await testing.eventually(replayed, timeout_s=15)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_without_a_bus_the_page_is_served_and_says_disconnected() -> None:
    nowhere = BusSettings.for_tests(f"nats://127.0.0.1:{_free_port()}")
    settings = serving.DashboardSettings(bus=nowhere, status_period_s=0.2)
    async with anyio.create_task_group() as tg:
        url = await tg.start(functools.partial(serving.serve, settings))
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as page:
                assert (
                    page.status == 200 and "<title>gpustack-operator</title>" in await page.text()
                )
            async with session.get(url + "events") as response:
                opened = await _until(_frames(response), "ready")
        tg.cancel_scope.cancel()
    assert opened[0] == ("status", {"connected": False, "now": opened[0][1]["now"]})  # type: ignore[index]
    assert [n for n, _ in opened] == ["status", "reset", "ready"]


async def test_the_page_loads_nothing_from_elsewhere() -> None:
    """No CDN at run time: the HTML names only same-origin files, the JavaScript reads only
    its own /events, and the Content-Security-Policy makes the browser refuse anything else."""
    settings = serving.DashboardSettings(
        bus=BusSettings.for_tests(f"nats://127.0.0.1:{_free_port()}")
    )
    hub = serving.Hub(Feed(), client_buffer=4)
    async with serving.http_server(settings, hub) as url, aiohttp.ClientSession() as session:
        for path in ("", "charts.js", "dashboard.js", "dashboard.css"):
            async with session.get(url + path) as r:
                assert r.status == 200
                csp = r.headers["Content-Security-Policy"]
                assert "default-src 'none'" in csp and "connect-src 'self'" in csp
        async with session.get(url + "nothing-here") as r:
            assert r.status == 404
    html = (STATIC / "index.html").read_text()
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == [
        "dashboard.css",
        "charts.js",
        "dashboard.js",
    ]
    script = (STATIC / "dashboard.js").read_text() + (STATIC / "charts.js").read_text()
    urls = set(re.findall(r"https?://[^\s\"'`]+", script))
    assert urls == {"http://www.w3.org/2000/svg"}  # a namespace name, never fetched
    assert "import " not in script and "fetch(" not in script
    assert "innerHTML" not in script  # bus strings reach the DOM as text only


async def test_a_page_that_falls_behind_is_closed_and_the_others_carry_on() -> None:
    hub = serving.Hub(Feed(), client_buffer=2)
    with hub.opened() as (_, slow), hub.opened() as (_, fast):
        for ev in testing.example_events("n")[:2]:
            hub.event(ev, now=0.0)
        assert [fast.receive_nowait() for _ in range(2)]  # the fast page drained its queue
        hub.event(testing.example_events("n")[2], now=0.0)  # the slow page is full now
        assert hub.pages == 1
        got = [slow.receive_nowait(), slow.receive_nowait()]
        assert all(f.startswith(b"event: bus\n") for f in got)
        with pytest.raises(anyio.EndOfStream):
            slow.receive_nowait()
        assert fast.receive_nowait().startswith(b"event: bus\n")
    assert hub.pages == 0


def test_the_command_reads_its_flags(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    argv = ["--port=0", "--bind-address=127.0.0.1", "--nats-url=nats://bus:4222",
            f"--nats-token-file={token}"]  # fmt: skip
    built = serving.settings_from(options_for(("dashboard",), argv))
    assert (built.port, built.bind_address) == (0, "127.0.0.1")
    assert built.bus.url == "nats://bus:4222" and built.bus.token_file == str(token)
    assert built.bus.inbox_prefix == "_INBOX.dashboard"
    with pytest.raises(SettingsError, match="not an IP address"):
        serving.settings_from(options_for(("dashboard",), ["--bind-address=everywhere"]))


async def test_a_taken_port_is_one_clear_error(bus: BusSettings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = serving.DashboardSettings(bus=bus, port=port)
        with pytest.raises(ServingFailed, match=f"cannot serve the dashboard on 127.0.0.1:{port}"):
            await serving.serve(settings)


async def test_a_start_cancelled_at_any_step_leaves_no_socket_bound() -> None:
    """The page's server starts through ``kit.listening.start_site`` like every other: cancelled
    at any loop turn of its start, it leaves no listening socket behind."""
    settings = serving.DashboardSettings(
        bus=BusSettings.for_tests(f"nats://127.0.0.1:{_free_port()}")
    )
    await testing_servers.cancel_every_start(
        lambda: serving.http_server(settings, serving.Hub(Feed(), client_buffer=4))
    )


async def test_livez_fails_once_off_the_bus_past_the_bound_and_recovers(tmp_path: Path) -> None:
    """As the agents' (tests/gpustack_operator/test_bus_faults.py): a real nats-server stopped
    past ``max_offline_s`` makes ``/livez`` 503 (kubelet restarts the dashboard); started again
    on its port, 200. ``/readyz`` stays 200: the page is served and says it is disconnected."""
    async with testing.nats_server(tmp_path) as server, anyio.create_task_group() as tg:
        bus = testing.settings_for(server, max_offline_s=1.0)
        settings = serving.DashboardSettings(bus=bus, status_period_s=0.2)
        url = await tg.start(functools.partial(serving.serve, settings))
        async with aiohttp.ClientSession() as session:

            def answers(path: str, status: int) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    async with session.get(url + path) as response:
                        return response.status == status

                return check

            await testing.eventually(answers("livez", 200))
            await server.stop()
            await testing.eventually(answers("livez", 503))
            async with session.get(url + "livez") as response:
                said = await response.text()
            assert (await session.get(url + "readyz")).status == 200
            await server.start()
            await testing.eventually(answers("livez", 200), timeout_s=30)
        tg.cancel_scope.cancel()
    assert said.startswith("off the bus for ") and "bound 1s" in said

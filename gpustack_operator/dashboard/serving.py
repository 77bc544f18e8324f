"""The dashboard's HTTP side: the page, and a server-sent-events feed of the bus.

One bus connection as the ``dashboard`` identity (read-only: the server lets it subscribe and
read the retained state, and publish nothing, see :mod:`bus.identity`) follows every node with
the retained state first (:func:`bus.subscribing.subscribe`, ``include_state=True``). Each
event is folded into a :class:`~gpustack_operator.dashboard.feed.Feed` and passed to every open
page. A page that opens gets a ``status`` frame, ``reset``, the feed's replay, ``ready``, then
the live frames; so it draws the cluster at once, without waiting for the first live sample.

The browser never speaks to the bus and never sees a credential: the page is same-origin
HTML/CSS/JS from this package (a Content-Security-Policy forbids anything else), and
``/events`` is the only data it reads. Frames (``event: <name>``, one JSON ``data`` line):

``status``  ``{"connected": bool, "now": RFC 3339}`` every ``status_period_s``: whether this
            server holds a bus connection now, and its clock (the page judges heartbeats by
            it, not by the browser's); also the keep-alive.
``reset``   forget everything: a replay follows.
``bus``     one event in its wire form (docs/bus.md), replayed or live.
``ready``   the replay is over.

Bounded everywhere: each page has a queue of ``client_buffer`` frames; a page that falls that
far behind is closed (the browser's EventSource reconnects and gets a fresh replay), so a
stalled browser never holds memory or slows the others.
"""

from __future__ import annotations

import datetime as dt
import importlib.resources
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Final

import anyio
import anyio.abc
import msgspec
from aiohttp import web
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from bus import connection, events, identity, subscribing
from bus.errors import BusError
from bus.metrics import BusMetrics
from bus.presence import Presence
from bus.settings import BusSettings, from_options
from gpustack_operator.dashboard.feed import Feed
from kit.httpsettings import bind_address
from kit.listening import ServingFailed, runner_for, serve_tcp
from kit.options import Flags, Options

__all__ = ["DashboardSettings", "Hub", "main", "serve", "settings_from"]

log = logging.getLogger(__name__)

_STATIC: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/charts.js": ("charts.js", "text/javascript; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_RETRY_S: Final = 1.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DASHBOARD_INBOX: Final = identity.inbox_prefix(identity.Identity(role="dashboard"))
"""The reply prefix the servers let the ``dashboard`` identity read."""


class DashboardSettings(msgspec.Struct, frozen=True, kw_only=True):
    bus: BusSettings
    """As the ``dashboard`` identity, with its reply prefix ``_INBOX.dashboard``."""
    bind_address: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port."""
    status_period_s: float = 2.0
    client_buffer: int = 1024
    samples_kept: int = 120
    """Samples per node a new page gets (its charts' history): 30 minutes at 15 s."""
    shutdown_timeout_s: float = 2.0


class DashboardFlags(Flags, frozen=True, kw_only=True):
    bind_address: str
    port: int


def settings_from(options: Options) -> DashboardSettings:
    """The ``dashboard`` command's settings; the bus as a dashboard (``bus watch``'s edge).

    :raises SettingsError: ``--bind-address`` is not an IP address.
    """
    flags = options.read_flags(DashboardFlags)
    return DashboardSettings(
        bus=msgspec.structs.replace(from_options(options), inbox_prefix=DASHBOARD_INBOX),
        bind_address=bind_address(flags.bind_address),
        port=flags.port,
    )


def frame(name: str, data: bytes) -> bytes:
    """One server-sent event; ``data`` is compact JSON (never a newline inside)."""
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


class Hub:
    """The feed and the open pages: every event goes into the one and out to the others."""

    def __init__(self, feed: Feed, *, client_buffer: int, presence: Presence | None = None) -> None:
        self.feed = feed
        self.client_buffer = client_buffer
        self.connection: connection.Connection | None = None
        self.presence = presence or Presence(since=anyio.current_time())
        """On the bus or not, and since when not (``/livez``); off it from the start until the
        first connection, as an agent's."""
        self._clients: set[MemoryObjectSendStream[bytes]] = set()

    @property
    def connected(self) -> bool:
        return self.connection is not None and self.connection.is_connected

    @property
    def pages(self) -> int:
        return len(self._clients)

    def status(self) -> bytes:
        now = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
        return frame("status", msgspec.json.encode({"connected": self.connected, "now": now}))

    def event(self, event: events.Event, *, now: float) -> None:
        self.broadcast(frame("bus", self.feed.apply(event, now=now)))

    def broadcast(self, data: bytes) -> None:
        for client in list(self._clients):
            try:
                client.send_nowait(data)
            except anyio.WouldBlock:
                log.info("a dashboard page fell %d frames behind; closing it", self.client_buffer)
                client.close()
                self._clients.discard(client)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._clients.discard(client)

    @contextmanager
    def opened(self) -> Iterator[tuple[bytes, MemoryObjectReceiveStream[bytes]]]:
        """A new page: the frames to send first, and the queue of live frames after them.

        The replay is taken and the queue registered with no await in between, so no event
        falls between the two.
        """
        send, receive = anyio.create_memory_object_stream[bytes](self.client_buffer)
        replay = [frame("bus", data) for data in self.feed.replay()]
        first = b"".join([self.status(), frame("reset", b"{}"), *replay, frame("ready", b"{}")])
        self._clients.add(send)
        try:
            with send, receive:
                yield first, receive
        finally:
            self._clients.discard(send)


async def follow(settings: DashboardSettings, hub: Hub) -> None:
    """Subscribe to every node, retained state first, and feed ``hub`` until cancelled.

    Until the retention streams exist (nothing has run yet), or while the state cannot be read,
    it retries every second; the connection itself reconnects forever.
    """
    metrics = BusMetrics()
    async with connection.connect(
        settings.bus, name="dashboard", retry=True, presence=hub.presence
    ) as conn:
        hub.connection = conn
        try:
            while True:
                try:
                    async with subscribing.subscribe(
                        conn, settings=settings.bus, metrics=metrics, include_state=True
                    ) as sub:
                        async for event in sub:
                            hub.event(event, now=anyio.current_time())
                except BusError as e:
                    log.warning("dashboard feed: waiting for the bus's retained state: %s", e)
                    await anyio.sleep(_RETRY_S)
        finally:
            hub.connection = None


async def tick(settings: DashboardSettings, hub: Hub) -> None:
    """Every ``status_period_s``: forget expired nodes and tell the pages the status."""
    while True:
        hub.feed.expire(now=anyio.current_time())
        hub.broadcast(hub.status())
        await anyio.sleep(settings.status_period_s)


def _page_handler(name: str, content_type: str) -> Handler:
    body = importlib.resources.files(__package__).joinpath("static", name).read_bytes()
    headers = {
        "Content-Type": content_type,
        "Content-Security-Policy": _CSP,
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-cache",
    }

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=body, headers=headers)

    return handle


def _events_handler(hub: Hub) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # proxies: pass frames on as they come
            }
        )
        await response.prepare(request)
        with hub.opened() as (first, receive):
            await response.write(b"retry: 2000\n\n" + first)
            async for data in receive:
                await response.write(data)
        return response

    return handle


def application(hub: Hub, *, max_offline_s: float = math.inf) -> web.Application:
    """The routes. ``/readyz``: the page is served (with or without the bus: it says which).
    ``/livez``: as the agents', fails once off the bus for longer than ``max_offline_s`` (the
    connection is replaced for ever, so one still off by then is stuck in a way only a restart
    may cure)."""
    app = web.Application()
    for path, (name, content_type) in _STATIC.items():
        app.router.add_get(path, _page_handler(name, content_type))
    app.router.add_get("/events", _events_handler(hub))

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def live(_: web.Request) -> web.Response:
        now = anyio.current_time()
        if hub.presence.alive(now, max_offline_s):
            return web.Response(text="ok\n")
        off = hub.presence.offline_for(now)
        return web.Response(
            status=503, text=f"off the bus for {off:.0f}s (bound {max_offline_s:g}s)\n"
        )

    app.router.add_get("/livez", live)
    app.router.add_get("/readyz", ready)
    return app


@asynccontextmanager
async def http_server(settings: DashboardSettings, hub: Hub) -> AsyncIterator[str]:
    """Serve the page and the feed on plain HTTP until the block exits; yield the page's URL.

    :raises ServingFailed: the address cannot be bound (port taken, no such address).
    """
    runner = runner_for(application(hub, max_offline_s=settings.bus.max_offline_s))
    await runner.setup()
    try:
        port = await serve_tcp(runner, settings.bind_address, settings.port)
    except OSError as e:
        raise ServingFailed(
            f"cannot serve the dashboard on {settings.bind_address}:{settings.port}: "
            f"{e.strerror or e}"
        ) from e
    try:
        yield _url(settings.bind_address, port)
    finally:
        with anyio.move_on_after(settings.shutdown_timeout_s, shield=True):
            await runner.cleanup()


def _url(host: str, port: int) -> str:
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/"


async def serve(
    settings: DashboardSettings,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard until cancelled; ``task_status.started(url)`` once it listens.

    The page is served before the bus answers: it shows "disconnected" until it does.
    """
    hub = Hub(
        Feed(samples_kept=settings.samples_kept, max_age_s=settings.bus.state_max_age_s),
        client_buffer=settings.client_buffer,
    )
    async with http_server(settings, hub) as url, anyio.create_task_group() as tg:
        tg.start_soon(follow, settings, hub, name="dashboard-feed")
        tg.start_soon(tick, settings, hub, name="dashboard-status")
        log.info("dashboard: %s", url)
        task_status.started(url)
        await anyio.sleep(math.inf)


async def main(settings: DashboardSettings) -> int:
    """The ``dashboard`` service."""
    await serve(settings)
    return 0

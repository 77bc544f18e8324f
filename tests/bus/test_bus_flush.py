"""``Connection.flush`` against a real nats-server, watched on the wire by a recording relay.

The promise under test: when ``flush`` returns, the server has read every command sent before
it (a subscription made just before is live, so nothing published from then on is missed by it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import pytest

from bus import connection
from bus.embedded import ServerProcess
from bus.settings import BusSettings

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

PING = b"PING\r\n"


@dataclass
class Relay:
    """What passed between one client and the server so far."""

    port: int = 0
    sent: bytearray = field(default_factory=bytearray)
    """Client to server, every byte in order."""
    pongs: int = 0
    """PONGs the server's answers carried to the client."""


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_chunk: Callable[[bytes], object]
) -> None:
    try:
        while chunk := await reader.read(65536):
            on_chunk(chunk)
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


@asynccontextmanager
async def relay_to(server: ServerProcess) -> AsyncIterator[Relay]:
    """A TCP relay in front of ``server`` that records what the client sends."""
    relay = Relay()
    tasks: list[asyncio.Task[None]] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", server.port)

        def count_pongs(chunk: bytes) -> None:
            relay.pongs += chunk.count(b"PONG\r\n")

        tasks.append(asyncio.ensure_future(_pipe(reader, up_writer, relay.sent.extend)))
        tasks.append(asyncio.ensure_future(_pipe(up_reader, writer, count_pongs)))

    listener = await asyncio.start_server(accept, "127.0.0.1", 0)
    relay.port = listener.sockets[0].getsockname()[1]
    try:
        yield relay
    finally:
        listener.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await listener.wait_closed()


def _answered_after(sent: bytes, command: bytes, pongs: int) -> bool:
    """Whether the server answered a PING that it read after ``command``.

    The server answers PINGs in the order it reads them, so it has read ``command`` once it
    answered the first PING that follows it on the wire.
    """
    at = sent.index(command)
    if PING not in sent[at:]:
        return False
    return pongs >= sent[:at].count(PING) + 1


@pytest.mark.parametrize("turns", [0, 1])
async def test_a_flush_returns_once_the_server_read_the_subscription_before_it(
    server: ServerProcess, settings: BusSettings, turns: int
) -> None:
    """nats-py alone writes the flush's PING before the queued SUB (fails with one round trip)."""
    async with relay_to(server) as relay:
        through = BusSettings.for_tests(f"nats://127.0.0.1:{relay.port}")
        async with (
            connection.connect(through, retry=False) as conn,
            conn.subscribe("flush.probe", lambda subject, payload: None),
        ):
            for _ in range(turns):
                await anyio.lowlevel.checkpoint()
            await conn.flush()
            sent, pongs = bytes(relay.sent), relay.pongs
    assert _answered_after(sent, b"SUB flush.probe ", pongs), sent


async def test_a_flush_returns_once_the_server_read_what_was_published_before_it(
    server: ServerProcess,
) -> None:
    async with relay_to(server) as relay:
        through = BusSettings.for_tests(f"nats://127.0.0.1:{relay.port}")
        async with connection.connect(through, retry=False) as conn:
            await conn.publish("flush.probe", b"x")
            await conn.flush()
            sent, pongs = bytes(relay.sent), relay.pongs
    assert _answered_after(sent, b"PUB flush.probe ", pongs), sent


async def test_a_message_published_after_a_flushed_subscription_always_arrives(
    server: ServerProcess, settings: BusSettings
) -> None:
    """The race the peers test met: a listener subscribes and flushes, another client then
    publishes once. Repeated, because the old single round trip lost it only sometimes."""
    async with connection.connect(settings, retry=False) as sender:
        for n in range(40):
            assert await _one_message_after_a_flushed_subscription(settings, sender, n) == b"hello"


async def _one_message_after_a_flushed_subscription(
    settings: BusSettings, sender: connection.Connection, n: int
) -> bytes:
    got: list[bytes] = []
    arrived = anyio.Event()

    def keep(subject: str, payload: bytes) -> None:
        got.append(payload)
        arrived.set()

    async with (
        connection.connect(settings, retry=False) as listener,
        listener.subscribe(f"flush.once.{n}", keep),
    ):
        await listener.flush()
        await sender.publish(f"flush.once.{n}", b"hello")
        await sender.flush()
        with anyio.fail_after(5):
            await arrived.wait()
    [payload] = got
    return payload

"""The Hub's HTTP/1.1 client against real servers: framing, keep-alive, failures, proxies, TLS.

Servers are asyncio TCP servers speaking raw HTTP (so malformed, cut and stalled answers can be
produced) and one aiohttp server (a real peer's chunked encoding). TLS uses a self-signed
certificate made by :func:`kit.tls.self_signed_certificate`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from hub import client as hub_client
from hub import http
from hub.errors import SourceUnavailable
from hub.urls import Url
from kit.tls import self_signed_certificate

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _request_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def _client(**kw: float) -> http.Client:
    return http.Client(
        connect_s=kw.get("connect_s", 10.0), stall_s=kw.get("stall_s", 10.0), max_connections=8
    )


async def _get(client: http.Client, url: str, proxy: str | None = None) -> bytes:
    response = await client.get(Url(url), {"User-Agent": "t"}, proxy)
    try:
        return await response.read(1 << 20)
    finally:
        response.release()


async def test_keep_alive_reuses_one_connection_for_requests_read_to_the_end() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                head = await _request_head(reader)
            except asyncio.IncompleteReadError:
                break
            body = head.split(b" ")[1]
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        writer.close()

    async with raw_server(handle) as port:
        client = _client()
        got = [await _get(client, f"http://127.0.0.1:{port}/p{i}") for i in range(3)]
        client.close()

    assert got == [b"/p0", b"/p1", b"/p2"]
    assert connections == 1


async def test_an_idle_connection_the_server_closed_is_replaced_once() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive announced, connection closed anyway

    async with raw_server(handle) as port:
        client = _client()
        first = await _get(client, f"http://127.0.0.1:{port}/")
        await asyncio.sleep(0.05)  # let the close arrive, or not: both paths must work
        second = await _get(client, f"http://127.0.0.1:{port}/")
        client.close()

    assert (first, second) == (b"ok", b"ok")


async def test_a_chunked_body_from_a_real_server_arrives_whole() -> None:
    payload = bytes(range(256)) * 1000

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Link": '<http://x/next?page=2>; rel="next"'})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for at in range(0, len(payload), 7000):
            await response.write(payload[at : at + 7000])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/c", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        client = _client()
        response = await client.get(Url(f"http://127.0.0.1:{port}/c"), {})
        body = await response.read(1 << 20)
        link = response.link("next")
        response.release()
        client.close()
    finally:
        await runner.cleanup()

    assert body == payload
    assert link == "http://x/next?page=2"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf!",  # cut body
        b"SPDY/9 200 OK\r\n\r\n",  # not HTTP/1.x
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n",  # int() takes a sign
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"X-T: 1\r\n" * 65,
    ],
)
async def test_malformed_or_cut_answers_are_http_errors(answer: bytes) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async with raw_server(handle) as port:
        client = _client()
        with pytest.raises(http.HttpError):
            await _get(client, f"http://127.0.0.1:{port}/")
        client.close()


async def test_a_cut_body_delivers_what_arrived_before_failing() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf!")
        await writer.drain()
        writer.close()

    got = bytearray()
    async with raw_server(handle) as port:
        client = _client()
        response = await client.get(Url(f"http://127.0.0.1:{port}/"), {})
        with pytest.raises(http.HttpError):
            async for piece in response.pieces():
                got += piece
        response.release()
        client.close()

    assert bytes(got) == b"half!"


async def test_a_stalled_answer_fails_and_a_refused_connection_too() -> None:
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
        await release.wait()
        writer.close()

    async with raw_server(handle) as port:
        client = _client(stall_s=0.2)
        with pytest.raises(http.HttpError, match="stall"):
            await _get(client, f"http://127.0.0.1:{port}/")
        release.set()
        client.close()
    with pytest.raises(http.HttpError, match="cannot connect"):
        await _get(_client(), f"http://127.0.0.1:{port}/")


async def test_https_through_a_connect_proxy_with_credentials(tmp_path: Path) -> None:
    cert, key = self_signed_certificate("localhost")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    tunnels: list[bytes] = []

    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _request_head(reader)
        path = head.split(b" ")[1]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(path), path))
        await writer.drain()
        writer.close()

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
        dst.close()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _request_head(reader)
        tunnels.append(head)
        _, port = head.split(b" ")[1].split(b":")
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async with raw_server(origin, tls) as origin_port, raw_server(proxy) as proxy_port:
        client = http.Client(
            connect_s=10.0, stall_s=10.0, max_connections=4, ca_file=str(tmp_path / "tls.crt")
        )
        got = await _get(
            client,
            f"https://localhost:{origin_port}/secret?x=1",
            proxy=f"http://user:pw@127.0.0.1:{proxy_port}",
        )
        client.close()

    assert got == b"/secret?x=1"  # the proxy saw only the tunnel, never the path
    assert tunnels[0].startswith(b"CONNECT localhost:%d HTTP/1.1" % origin_port)
    assert b"Proxy-Authorization: Basic dXNlcjpwdw==" in tunnels[0]
    assert b"secret" not in tunnels[0]


@pytest.mark.parametrize(
    "location", [b"http://127.0.0.1:99999/x", b"ftp://elsewhere/x", b"http://[::1/x"]
)
async def test_a_redirect_to_a_malformed_url_is_source_unavailable(location: bytes) -> None:
    """The Hub client follows ``Location`` by hand: one it cannot parse is the Hub's failure,
    said in one line, never an exception from the URL parser."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(
            b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    async with raw_server(handle) as port:
        settings = hub_client.HubSettings(endpoint=f"http://127.0.0.1:{port}")
        async with hub_client.client(settings) as hub:
            with pytest.raises(SourceUnavailable, match="redirect to"):
                await hub.commit("org/model", "main", token=None)


async def test_gather_takes_a_body_in_pieces_and_leaves_the_connection_ready() -> None:
    """A ``Content-Length`` body that arrives in several writes is gathered whole, its pieces
    never joined, and the connection then serves the next request; a body over the limit is
    refused before it is read."""
    parts = [b"a" * 3000, b"b" * 5000, b"c" * 7]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % sum(map(len, parts)))
        for part in parts:
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(part)
        await _request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await _request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ntoo long!")
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    async with raw_server(handle) as port:
        client = _client()
        url = Url(f"http://127.0.0.1:{port}/")
        response = await client.get(url, {})
        pieces = await response.gather(1 << 20)
        response.release()
        second = await client.get(url, {})
        reused = second._conn.reused
        assert await second.gather(10) == [b"ok"]
        second.release()
        third = await client.get(url, {})
        with pytest.raises(http.HttpError, match="body over 8 bytes"):
            await third.gather(8)
        third.release()
        client.close()

    assert len(pieces) >= 2 and b"".join(pieces) == b"".join(parts)
    assert reused

"""Every server bounds what a connection may take (issue 31, item 6): a request head sent
slowly (slowloris) or never, a TLS handshake never finished, a body that trickles, are each
closed after their bound. Bounds here are a second; the waits allow thirty (never timed)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest
from prometheus_client import CollectorRegistry

from kit import listening, serving

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

TIGHT = listening.Limits(header_timeout_s=1.0, body_timeout_s=1.0)
GENEROUS_S = 30.0
"""Far past every bound, far below the old behaviour (an hour; a minute for a handshake)."""


@asynccontextmanager
async def _server(limits: listening.Limits = TIGHT) -> AsyncIterator[serving.Server]:
    async def echo(body: bytes) -> serving.Response:
        return serving.Response(body=body)

    settings = serving.HttpsSettings(bind_address="127.0.0.1", port=0, auth="none")
    async with serving.https_server(
        settings,
        registry=CollectorRegistry(),
        ready=lambda: True,
        posts={"/echo": echo},
        limits=limits,
    ) as server:
        yield server


def _insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def _closed_by_server(stream: anyio.abc.ByteStream) -> bytes:
    """Everything the server sends until it closes the connection (within GENEROUS_S)."""
    received = b""
    with anyio.fail_after(GENEROUS_S):
        while True:
            try:
                received += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ssl.SSLError):
                return received


async def test_a_slowloris_head_is_closed_after_the_header_timeout() -> None:
    async with _server() as server:
        stream = await anyio.connect_tcp(
            "127.0.0.1", server.port, tls=True, ssl_context=_insecure()
        )
        async with stream:
            await stream.send(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: ")

            async def trickle() -> None:  # a byte of one header every 0.2 s, never its end
                for _ in range(int(GENEROUS_S * 5)):
                    await stream.send(b"a")
                    await anyio.sleep(0.2)

            async with anyio.create_task_group() as tg:
                tg.start_soon(trickle)
                received = await _closed_by_server(stream)
                tg.cancel_scope.cancel()
        assert b"200" not in received


async def test_a_tls_handshake_never_started_is_closed() -> None:
    async with _server() as server, await anyio.connect_tcp("127.0.0.1", server.port) as stream:
        assert await _closed_by_server(stream) == b""


async def test_a_trickling_body_gets_408_and_a_closed_connection() -> None:
    async with _server() as server:
        stream = await anyio.connect_tcp(
            "127.0.0.1", server.port, tls=True, ssl_context=_insecure()
        )
        async with stream:
            await stream.send(
                b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 10
            )
            received = await _closed_by_server(stream)
        assert received.startswith(b"HTTP/1.1 408")


async def test_a_prompt_client_is_served_and_kept_alive_within_the_bounds() -> None:
    async with _server() as server:
        stream = await anyio.connect_tcp(
            "127.0.0.1", server.port, tls=True, ssl_context=_insecure()
        )
        async with stream:
            for _ in range(2):  # two requests on one connection
                await stream.send(
                    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
                )
                received = b""
                with anyio.fail_after(GENEROUS_S):
                    while not received.endswith(b"hello"):
                        received += await stream.receive()
                assert received.startswith(b"HTTP/1.1 200")
            # Idle past the bound: the server closes the kept-alive connection.
            assert await _closed_by_server(stream) == b""


async def test_a_request_head_past_the_field_limits_is_refused() -> None:
    async with _server() as server:
        stream = await anyio.connect_tcp(
            "127.0.0.1", server.port, tls=True, ssl_context=_insecure()
        )
        async with stream:
            fields = b"".join(b"X-%d: v\r\n" % i for i in range(TIGHT.max_headers + 10))
            await stream.send(b"GET /livez HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
            received = await _closed_by_server(stream)
        assert received.split(b" ", 2)[1] == b"400" and b"Too many headers" in received

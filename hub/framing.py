"""HTTP/1.1 framing for :mod:`hub.http`: one connection's received bytes, a response head, bodies.

Kept apart from the client (connections, requests, the pool) because this part is pure
byte handling over a buffer: :class:`Stream` holds what the transport delivered, with flow
control (reading pauses above :data:`HIGH_WATER` buffered, resumes under :data:`LOW_WATER`), and
the readers below take from it: :func:`head` (status line and headers, at most
:data:`MAX_HEAD`), :func:`exactly` (a ``Content-Length`` body) and :func:`chunked`. A reader
that took more than its part puts the rest back (:meth:`Stream.unread`), so the next answer on a
kept-alive connection starts where this one ended. Every failure is :class:`HttpError`.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Final

__all__ = [
    "HIGH_WATER",
    "LOW_WATER",
    "MAX_HEAD",
    "HttpError",
    "Stream",
    "chunked",
    "exactly",
    "head",
]

HIGH_WATER: Final = 2 * 1024 * 1024
LOW_WATER: Final = 512 * 1024
MAX_HEAD: Final = 64 * 1024
"""The status line and headers of an answer may not exceed this."""
MAX_TRAILERS: Final = 64
"""Trailer lines after a chunked body (each at most 4 KiB) that are read and dropped."""
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,15}")
"""A chunk size: plain hex digits (no sign, ``0x`` or ``_``, which ``int`` would take)."""


class HttpError(Exception):
    """The exchange failed: no connection, a cut or stalled answer, or a malformed one."""


class Stream(asyncio.Protocol):
    """The bytes of one connection as the transport delivered them, with flow control."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.pieces: deque[bytes | memoryview] = deque()
        self.buffered = 0
        self.closed = False
        self.error: BaseException | None = None
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None
        self.gone = asyncio.Event()
        """Set once the transport is gone (:meth:`connection_lost`): after a TLS session's
        close, only when its shutdown exchange ended."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.pieces.append(data)
        self.buffered += len(data)
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self.gone.set()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take(self) -> bytes | memoryview | None:
        """The next bytes received if some are buffered, without waiting (None otherwise): a
        body that arrived with its head is read without a coroutine per piece."""
        if not self.pieces:
            return None
        data = self.pieces.popleft()
        self.buffered -= len(data)
        if self.paused and self.buffered < LOW_WATER and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return data

    async def piece(self, stall_s: float) -> bytes | memoryview:
        """The next bytes received, or ``b""`` once the peer closed (all received bytes first).

        :raises HttpError: nothing arrived for ``stall_s``.
        """
        while not self.pieces:
            if self.closed:
                return b""
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(stall_s, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        data = self.take()
        assert data is not None
        return data

    def unread(self, data: bytes | memoryview) -> None:
        if data:
            self.pieces.appendleft(data)
            self.buffered += len(data)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(HttpError("no byte received within the stall timeout"))


async def head(stream: Stream, stall_s: float) -> tuple[int, dict[str, str], bool]:
    """Read a status line and headers: (status, lower-case headers, HTTP/1.1 or later)."""
    buf = bytearray()
    while True:
        piece = stream.take() or await stream.piece(stall_s)
        if not piece:
            raise HttpError("connection closed before a response" if not buf else "cut head")
        if not buf and (end := bytes(piece[:MAX_HEAD]).find(b"\r\n\r\n")) >= 0:
            view = memoryview(piece)  # the usual case: the whole head in one piece, no copy
            stream.unread(view[end + 4 :])
            head = bytes(view[:end])
            break
        buf += piece
        if (end := buf.find(b"\r\n\r\n")) >= 0:
            stream.unread(memoryview(bytes(buf[end + 4 :])))
            head = bytes(buf[:end])
            break
        if len(buf) > MAX_HEAD:
            raise HttpError(f"response head over {MAX_HEAD} bytes")
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise HttpError(f"malformed status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(f"malformed header line {line[:80]!r}")
        key, value = name.lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return int(code), headers, version != "HTTP/1.0"


async def exactly(stream: Stream, n: int, stall_s: float) -> AsyncIterator[bytes | memoryview]:
    while n > 0:
        piece = await stream.piece(stall_s)
        if not piece:
            raise HttpError(f"connection closed with {n} bytes of the body missing")
        if len(piece) > n:
            view = memoryview(piece)
            stream.unread(view[n:])
            piece = view[:n]
        n -= len(piece)
        yield piece


async def _line(stream: Stream, stall_s: float) -> bytes:
    buf = bytearray()
    while (end := buf.find(b"\r\n")) < 0:
        if len(buf) > 4096:
            raise HttpError("malformed chunked body: line too long")
        piece = await stream.piece(stall_s)
        if not piece:
            raise HttpError("connection closed inside a chunked body")
        buf += piece
    stream.unread(memoryview(bytes(buf[end + 2 :])))
    return bytes(buf[:end])


async def chunked(stream: Stream, stall_s: float) -> AsyncIterator[bytes | memoryview]:
    while True:
        size_text = (await _line(stream, stall_s)).split(b";")[0].strip()
        if not _HEX.fullmatch(size_text):
            raise HttpError(f"malformed chunk size {size_text[:20]!r}")
        size = int(size_text, 16)
        if size == 0:
            for _ in range(MAX_TRAILERS + 1):  # trailers, up to the empty line
                if not await _line(stream, stall_s):
                    return
            raise HttpError(f"more than {MAX_TRAILERS} trailer lines")
        async for piece in exactly(stream, size, stall_s):
            yield piece
        if await _line(stream, stall_s):
            raise HttpError("malformed chunked body: no CRLF after a chunk")

"""A small HTTP/1.1 client on asyncio transports: the GETs the Hub client makes, nothing more.

Why not aiohttp: importing it costs more CPU than a small ``mm pull`` spends downloading
(0.35 s of user time on the machine that measured, about 1 s of wall time when it was shared),
and its request path costs about 1 ms per request; a pull of many small files makes two
requests per file. This client writes each request in one ``send``, hands the body on as the
transport received it (no copy), keeps connections alive, and builds a TLS context only for https.

What it speaks: GET with ``Content-Length``, ``chunked`` or read-to-close bodies; keep-alive
(a reused connection the server already closed is retried once on a fresh one, before any
byte of the answer); an ``http`` proxy (absolute-form requests) or an ``https`` one through
``CONNECT``, with ``user:password`` in the proxy URL sent as Basic credentials; a connect
timeout and a *stall* timeout (no byte for that long). Every failure is :class:`HttpError`.

Invariants: at most ``max_connections`` connections exist; a connection goes back to the pool
only after its whole body was read and neither side asked to close; memory per connection is
bounded by :data:`hub.framing.HIGH_WATER` (reading pauses above it). The framing itself
(heads, bodies, the buffer) is :mod:`hub.framing`.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from hub import framing
from hub.framing import HttpError
from hub.urls import Url

__all__ = ["CLOSE_TIMEOUT_S", "Client", "HttpError", "Response"]

CLOSE_TIMEOUT_S = 2.0
"""How long :meth:`Client.aclose` waits for the connections' orderly close before aborting."""


@dataclass(eq=False)
class _Conn:
    key: tuple[str, str, int, str | None]
    stream: framing.Stream
    reused: bool = False

    def close(self) -> None:
        if self.stream.transport is not None:
            self.stream.transport.close()


@dataclass
class Response:
    """An answer being read; :meth:`release` (always) returns or closes its connection."""

    status: int
    headers: Mapping[str, str]
    """Lower-case names; repeated headers joined with ``", "``."""
    _conn: _Conn
    _client: Client
    _keep: bool
    _done: bool = False
    _released: bool = field(default=False)

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isascii() and value.isdigit() else None

    def link(self, rel: str) -> str | None:
        """The target of the ``Link`` header's ``rel`` (the Hub's paging)."""
        for part in self.headers.get("link", "").split(","):
            target, _, params = part.partition(";")
            rels = [p.strip().removeprefix("rel=").strip('"') for p in params.split(";")]
            if rel in " ".join(rels).split() and target.strip().startswith("<"):
                return target.strip()[1:-1]
        return None

    async def pieces(self) -> AsyncIterator[bytes | memoryview]:
        """The body as it arrives. :raises HttpError: cut, stalled or malformed."""
        stall = self._client.stall_s
        stream = self._conn.stream
        if self.status in (204, 304):
            pass
        elif "chunked" in self.headers.get("transfer-encoding", "").lower():
            async for piece in framing.chunked(stream, stall):
                yield piece
        elif (length := self.content_length) is not None:
            async for piece in framing.exactly(stream, length, stall):
                length -= len(piece)
                self._done = not length  # before the last yield: a reader may stop there
                yield piece
        else:
            self._keep = False
            while piece := await stream.piece(stall):
                yield piece
            if stream.error is not None:
                raise HttpError(f"connection lost: {stream.error}")
        self._done = True

    async def gather(self, limit: int) -> list[bytes | memoryview]:
        """The whole body as the pieces that arrived (never joined).

        A ``Content-Length`` body is read in a loop of its own, without the generators of
        :meth:`pieces`: a small file's body usually arrived with its head, and a pull of
        thousands of them paid for those generators per file.

        :raises HttpError: over ``limit`` bytes, cut or stalled.
        """
        length = self.content_length
        if length is None or self.status in (204, 304) or "transfer-encoding" in self.headers:
            return await self._gather_pieces(limit)
        if length > limit:
            raise HttpError(f"body over {limit} bytes")
        stream, stall = self._conn.stream, self._client.stall_s
        parts: list[bytes | memoryview] = []
        while length:
            piece = stream.take() or await stream.piece(stall)
            if not piece:
                raise HttpError(f"connection closed with {length} bytes of the body missing")
            if len(piece) > length:
                view = memoryview(piece)
                stream.unread(view[length:])
                piece = view[:length]
            parts.append(piece)
            length -= len(piece)
        self._done = True
        return parts

    async def _gather_pieces(self, limit: int) -> list[bytes | memoryview]:
        parts: list[bytes | memoryview] = []
        size = 0
        async for piece in self.pieces():
            size += len(piece)
            if size > limit:
                raise HttpError(f"body over {limit} bytes")
            parts.append(piece)
        return parts

    async def read(self, limit: int) -> bytes:
        """The whole body. :raises HttpError: over ``limit`` bytes, cut or stalled."""
        return b"".join(await self.gather(limit))

    async def discard(self, limit: int = 64 * 1024) -> None:
        """Read and drop a small body (a redirect's), so the connection can be reused; a
        longer one is left to :meth:`release`, which then closes the connection."""
        if self.content_length is None or self.content_length > limit:
            return
        try:
            await self.gather(limit)
        except HttpError:
            self._keep = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._client._return(self._conn, reuse=self._done and self._keep)


def _basic(url: Url) -> str | None:
    if url.user is None:
        return None
    pair = f"{url.user}:{url.password or ''}".encode()
    return "Basic " + base64.b64encode(pair).decode()


class Client:
    """Keep-alive connections by (scheme, host, port, proxy); close with :meth:`close`."""

    def __init__(
        self,
        *,
        connect_s: float,
        stall_s: float,
        max_connections: int,
        ca_file: str | None = None,
    ) -> None:
        self.connect_s = connect_s
        self.stall_s = stall_s
        self._ca_file = ca_file
        self._ssl: Any = None
        self._idle: dict[tuple[str, str, int, str | None], list[_Conn]] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self._open: set[_Conn] = set()

    def _context(self) -> Any:
        if self._ssl is None:
            import ssl

            self._ssl = ssl.create_default_context(cafile=self._ca_file)
        return self._ssl

    async def get(self, url: Url, headers: Mapping[str, str], proxy: str | None = None) -> Response:
        """Send a GET and read the answer's head; the body is read from the :class:`Response`.

        :raises HttpError: no connection, no valid answer, or a malformed ``proxy`` URL.
        """
        try:
            proxy_url = Url(proxy) if proxy else None
        except ValueError as e:
            raise HttpError(f"the proxy URL is not usable: {e}") from e
        key = (url.scheme, url.host, url.port, proxy)
        for _ in range(2):
            conn = await self._connection(key, url, proxy_url)
            try:
                conn.stream.transport.write(self._request(url, headers, proxy_url))
                status, head, keep = await framing.head(conn.stream, self.stall_s)
            except HttpError:
                self._return(conn, reuse=False)
                if conn.reused:
                    continue  # the server closed an idle connection: once more, fresh
                raise
            except BaseException:
                self._return(conn, reuse=False)
                raise
            keep = keep and "close" not in head.get("connection", "").lower()
            return Response(status, head, conn, self, keep)
        raise HttpError("the server closed every connection")  # pragma: no cover

    def _request(self, url: Url, headers: Mapping[str, str], proxy: Url | None) -> bytes:
        plain_proxy = proxy is not None and url.scheme == "http"
        target = str(url) if plain_proxy else url.target
        lines = [f"GET {target} HTTP/1.1", f"Host: {url.host_port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if plain_proxy and proxy is not None and (auth := _basic(proxy)):
            lines.append(f"Proxy-Authorization: {auth}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _connection(
        self, key: tuple[str, str, int, str | None], url: Url, proxy: Url | None
    ) -> _Conn:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.stream.closed and not conn.stream.pieces:
                conn.reused = True
                return conn
            self._drop(conn)
        if self._slots.locked():  # every slot taken: idle connections to elsewhere go first
            for conns in self._idle.values():
                while conns:
                    self._drop(conns.pop())
        await self._slots.acquire()
        conn = _Conn(key, framing.Stream())
        try:
            async with asyncio.timeout(self.connect_s):
                await self._dial(conn, url, proxy)
        except BaseException as e:
            conn.close()  # a tunnel or TLS handshake cut short leaves a transport behind
            self._slots.release()
            if isinstance(e, (OSError, TimeoutError)):
                raise HttpError(f"cannot connect to {url.host}: {e or type(e).__name__}") from e
            raise
        self._open.add(conn)
        return conn

    async def _dial(self, conn: _Conn, url: Url, proxy: Url | None) -> None:
        loop = asyncio.get_running_loop()
        tls = url.scheme == "https"
        via = proxy if proxy is not None else url
        host, port = via.host, via.port
        if proxy is not None and tls:
            await loop.create_connection(lambda: conn.stream, host, port)
            await self._tunnel(conn, url, proxy)
            conn.stream.transport = await loop.start_tls(
                conn.stream.transport, conn.stream, self._context(), server_hostname=url.host
            )
            return
        ssl = self._context() if tls else None
        await loop.create_connection(
            lambda: conn.stream, host, port, ssl=ssl, server_hostname=url.host if tls else None
        )

    async def _tunnel(self, conn: _Conn, url: Url, proxy: Url) -> None:
        """``CONNECT host:port`` through an https proxy; the TLS session runs inside it."""
        target = url.host_port
        if url.explicit_port is None:
            target = f"{target}:{url.port}"
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if auth := _basic(proxy):
            lines.append(f"Proxy-Authorization: {auth}")
        conn.stream.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        try:
            status, _, _ = await framing.head(conn.stream, self.stall_s)
        except BaseException:
            conn.close()
            raise
        if status != 200 or conn.stream.pieces:
            conn.close()
            raise HttpError(f"the proxy refused CONNECT {target}: HTTP {status}")

    def _return(self, conn: _Conn, *, reuse: bool) -> None:
        if reuse and not conn.stream.closed and not conn.stream.pieces:
            self._idle.setdefault(conn.key, []).append(conn)
            return
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        if conn in self._open:
            self._open.discard(conn)
            self._slots.release()

    def close(self) -> None:
        """Start closing every connection (see :meth:`aclose`, which waits for it)."""
        for conn in list(self._open):
            self._drop(conn)
        self._idle.clear()

    async def aclose(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close every connection and wait until each transport is gone, at most ``timeout_s``
        (then the rest are aborted). A TLS connection's close starts a shutdown exchange with
        the peer (through the proxy, for a tunnel); without this wait a loop that ends right
        after holds transports still open, which uvloop refuses to close."""
        streams = [conn.stream for conn in self._open]
        self.close()
        try:
            async with asyncio.timeout(timeout_s):
                for stream in streams:
                    await stream.gone.wait()
        except TimeoutError:
            for stream in streams:
                if not stream.gone.is_set() and stream.transport is not None:
                    stream.transport.abort()

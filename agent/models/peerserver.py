"""The serving side of peer delivery: published trees, read-only, to this cluster's model agents.

Two routes on a port of their own (``--peer-port``), plain HTTP so a file goes out by
``sendfile(2)`` (the reader verifies every byte by digest, so TLS would buy integrity twice;
see docs/models.md for confidentiality):

``GET /peer/v1/trees/<hex>``
    the stored manifest text of a *published* tree (``published/<hex>/manifest``);
``GET /peer/v1/trees/<hex>/files/<path>``
    one file of it, whole (200) or one byte range (206, ``Range: bytes=a-b``, ``a-``, ``-n``;
    a range past the end is 416, several ranges are answered whole).

Invariants:

- only a published digest (its marker written: sealed, complete, verified) is served; a partial
  attempt never is, so no peer ever sees a byte this node has not verified;
- only a path the stored manifest lists is served (a byte-exact lookup, so ``..``, empty
  segments and anything else the manifest rules refuse cannot name a file), opened by walking
  the tree with ``O_NOFOLLOW`` from its directory, and only a regular file of the manifest's
  size: a symlink anywhere, or a file of another size, is 404;
- every request carries a signature of a live peer (:func:`bus.peers.verify_request`), else
  401 with a one-line reason; nothing is served anonymously. A node with no live offer here is
  waited for (``hello_wait_s``: its first offer may still travel), then refused with
  ``WWW-Authenticate: GPUStack-Peer error="unknown-node"``, which its client answers by
  announcing again and asking once more (:mod:`agent.models.peerclient`);
- at most ``serving_streams`` files are sent at once, at most ``streams_per_source`` of them to
  one asking node; a request waits ``queue_s`` for both, then gets 503 (the reader tries
  another peer or the Hub).
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import stat
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import IO, Final

import anyio
import anyio.to_thread
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from agent.models import layout
from agent.models.peering import Directory, PeerSettings
from bus import peers as contract
from bus.errors import InvalidToken
from hub.errors import InvalidManifest
from hub.manifest import Entry, parse
from kit import listening, serving

__all__ = ["PeerServer", "Streams", "parse_range", "serve"]

log = logging.getLogger(__name__)

_MANIFESTS_KEPT: Final = 64
_WAITING_MAX: Final = 32
"""Requests of unknown nodes held at once for their offer (more are refused at once: a
stranger must not hold many connections open by naming nodes that do not exist)."""
_STALL_S: Final = 30.0
"""A reader that takes no byte for this long is dropped (as the Hub client's stall bound)."""
_NOT_FOUND: Final = "no published tree of that digest holds that file"
_BUSY: Final = "every serving stream is busy"


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """``Range`` -> the ``[start, end)`` to send; None: the whole file (pure).

    :raises ValueError: a single range that starts at or past the end (416).
    """
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    first, sep, last = value[6:].strip().partition("-")
    if not sep or not (first.isdigit() or last.isdigit()):
        return None
    if not first:  # the last n bytes
        n = int(last) if last.isdigit() else 0
        if n == 0:
            raise ValueError("an empty suffix range")
        return max(0, size - n), size
    if not first.isdigit() or (last and not last.isdigit()):
        return None
    start = int(first)
    end = min(size, int(last) + 1) if last else size
    if start >= size or end <= start:
        raise ValueError(f"range starts at {start} of {size} bytes")
    return start, end


def open_entry(tree: str, entry: Entry) -> int:
    """A read-only descriptor of ``entry`` under ``tree``, never through a link (blocking).

    :raises FileNotFoundError: missing, a link anywhere on the way, not a regular file, or
        not the manifest's size.
    """
    parts = entry.path.split("/")
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        directory = os.open(tree, flags)
    except OSError as e:
        raise FileNotFoundError(entry.path) from e
    try:
        for part in parts[:-1]:
            inner = os.open(part, flags, dir_fd=directory)
            os.close(directory)
            directory = inner
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except OSError as e:  # ELOOP for a link, ENOTDIR, ENOENT
        raise FileNotFoundError(entry.path) from e
    finally:
        os.close(directory)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != entry.size:
        os.close(fd)
        raise FileNotFoundError(entry.path)
    return fd


def send_all(out: int, src: int, offset: int, count: int, stall_s: float) -> None:
    """``sendfile(2)`` ``count`` bytes of ``src`` from ``offset`` to the non-blocking socket
    ``out``, waiting (``poll``) while it is full; blocking: run in a worker thread.

    :raises TimeoutError: the socket took no byte for ``stall_s``.
    :raises OSError: the peer went away (``EPIPE``, ``ECONNRESET``) or the file shrank.
    """
    poller = select.poll()
    poller.register(out, select.POLLOUT)
    while count:
        try:
            sent = os.sendfile(out, src, offset, count)
        except BlockingIOError:
            if not poller.poll(int(stall_s * 1000)):
                raise TimeoutError(f"the peer took no byte for {stall_s:.0f}s") from None
            continue
        if sent == 0:
            raise ConnectionResetError("the file ended early")
        offset, count = offset + sent, count - sent


class _FileResponse(web.StreamResponse):
    """``count`` bytes of an open file from ``offset``, by ``sendfile(2)``.

    Neither uvloop (the service's loop) nor TLS transports implement ``loop.sendfile``; so once
    the head left the transport's buffer (at once, for a connection that is not backed up), a worker thread sends the body straight from the page
    cache into the connection's socket (:func:`send_all`), which the loop does not write to
    meanwhile (this handler is the connection's only writer, and it waits). Where the socket
    cannot be had, the file is copied through the transport instead.
    """

    def __init__(self, fobj: IO[bytes], offset: int, count: int, *, status: int) -> None:
        super().__init__(status=status)
        self._fobj, self._offset, self._count = fobj, offset, count
        self.content_length = count

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self.prepared:  # sent by the handler (the file is open only there); aiohttp asks again
            return await super().prepare(request)
        writer = await super().prepare(request)
        assert writer is not None
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("connection lost")
        if not await self._sendfile(transport):
            await self._copy(writer)
        await super().write_eof()
        return writer

    async def _sendfile(self, transport: asyncio.Transport) -> bool:
        """Send the body by ``sendfile(2)``; False: not possible here (nothing was sent)."""
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None:
            return False
        if transport.get_write_buffer_size():  # the head did not leave at once: keep the order
            return False
        await anyio.to_thread.run_sync(
            send_all, sock.fileno(), self._fobj.fileno(), self._offset, self._count, _STALL_S
        )
        return True

    async def _copy(self, writer: AbstractStreamWriter) -> None:
        left, at = self._count, self._offset
        while left:
            data = await anyio.to_thread.run_sync(
                os.pread, self._fobj.fileno(), min(left, 1 << 20), at
            )
            if not data:
                raise ConnectionResetError("the file ended early")
            await writer.write(data)
            left, at = left - len(data), at + len(data)


@dataclass
class PeerServer:
    """The routes' handlers, over one cache and the live peers' keys."""

    node: str
    cache: layout.Cache
    directory: Directory
    settings: PeerSettings
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._slots = anyio.Semaphore(self.settings.serving_streams)
        self._streams = Streams(self.settings.streams_per_source)
        self._manifests: dict[str, tuple[bytes, dict[str, Entry]]] = {}

    async def _admit(self, request: web.Request) -> str | web.Response:
        """The asking node, or the 401 to answer. A request naming a node with no live offer
        here waits (``hello_wait_s``, :data:`_WAITING_MAX` requests at once) for one: a node
        that just started asks while its first offer travels. Still unknown, the 401 says
        ``unknown-node``, which the asker cures by announcing again."""
        value = request.headers.get("Authorization")
        try:
            client = contract.parse_authorization(value or "")[0]
        except InvalidToken:
            return _refused(unknown_node=False)
        if not self.directory.knows(client) and self.directory.waiting < _WAITING_MAX:
            await self.directory.wait_for(client, self.settings.hello_wait_s)
        if not self.directory.knows(client):
            log.debug("peer request refused: node %s offers no peer key", client)
            return _refused(unknown_node=True)
        return self._check(request) or _refused(unknown_node=False)

    def _check(self, request: web.Request) -> str | None:
        """The asking node, or None (the reason is logged at debug)."""
        value = request.headers.get("Authorization")
        if value is None:
            return None
        try:
            return contract.verify_request(
                value,
                server=self.node,
                path=request.raw_path,
                now=self.clock(),
                key_of=self.directory.keys(),
            )
        except InvalidToken as e:
            log.debug("peer request refused: %s", e)
            return None

    def _load(self, hex_: str) -> tuple[bytes, dict[str, Entry]] | None:
        """The stored manifest of a published ``hex_`` (blocking); None: not published."""
        if not self.cache.is_published(hex_):
            return None
        kept = self._manifests.get(hex_)
        if kept is not None:
            return kept
        try:
            text = (self.cache.published / hex_ / "manifest").read_bytes()
            manifest = parse(text.decode("utf-8"))
        except (OSError, UnicodeDecodeError, InvalidManifest) as e:
            log.warning("sha256:%s: stored manifest unreadable: %s", hex_[:12], e)
            return None
        if manifest.digest != "sha256:" + hex_:
            log.warning("sha256:%s: the stored manifest is of another digest", hex_[:12])
            return None
        if len(self._manifests) >= _MANIFESTS_KEPT:
            self._manifests.pop(next(iter(self._manifests)))
        kept = self._manifests[hex_] = (text, {e.path: e for e in manifest.entries})
        return kept

    async def tree(self, request: web.Request) -> web.StreamResponse:
        client = await self._admit(request)
        if isinstance(client, web.Response):
            return client
        hex_ = request.match_info["hex"]
        kept = await anyio.to_thread.run_sync(self._load, hex_) if contract.is_hex(hex_) else None
        if kept is None:
            return _text(404, "no published tree of that digest")
        return web.Response(body=kept[0], content_type="text/plain", charset="utf-8")

    async def file(self, request: web.Request) -> web.StreamResponse:
        client = await self._admit(request)
        if isinstance(client, web.Response):
            return client
        hex_, path = request.match_info["hex"], request.match_info["path"]
        kept = await anyio.to_thread.run_sync(self._load, hex_) if contract.is_hex(hex_) else None
        entry = None if kept is None else kept[1].get(path)
        if entry is None:
            return _text(404, _NOT_FOUND)
        try:
            span = parse_range(request.headers.get("Range"), entry.size)
        except ValueError:
            return _text(416, f"the range is past the end of {entry.size} bytes")
        async with self._stream(client) as taken:
            if taken is not None:
                return _text(503, taken)
            return await self._send(request, self.cache.tree(hex_), entry, span)

    @asynccontextmanager
    async def _stream(self, client: str) -> AsyncIterator[str | None]:
        """One of ``client``'s ``streams_per_source`` and one of the ``serving_streams``, held
        while inside; None, or which of them was not had within ``queue_s`` (the wait is
        bounded, not the sending)."""
        mine = theirs = False
        with anyio.move_on_after(self.settings.queue_s):
            await self._streams.acquire(client)
            mine = True
            await self._slots.acquire()
            theirs = True
        try:
            yield None if theirs else _BUSY if mine else f"node {client} has every stream it may"
        finally:
            if theirs:
                self._slots.release()
            if mine:
                self._streams.release(client)

    async def _send(
        self,
        request: web.Request,
        tree: os.PathLike[str],
        entry: Entry,
        span: tuple[int, int] | None,
    ) -> web.StreamResponse:
        try:
            fd = await anyio.to_thread.run_sync(open_entry, os.fspath(tree), entry)
        except FileNotFoundError:
            return _text(404, _NOT_FOUND)
        with os.fdopen(fd, "rb") as fobj:
            start, end = span if span is not None else (0, entry.size)
            response = _FileResponse(fobj, start, end - start, status=206 if span else 200)
            response.headers["Accept-Ranges"] = "bytes"
            response.content_type = "application/octet-stream"
            if span is not None:
                response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
            await response.prepare(request)
            return response


def _text(status: int, reason: str) -> web.Response:
    return web.Response(status=status, text=reason + "\n")


def _refused(*, unknown_node: bool) -> web.Response:
    """401, saying (``WWW-Authenticate``) whether the asker is only not known yet."""
    reason = (
        "no live peer offer of the asking node (announce, then ask again)"
        if unknown_node
        else "a signed request of a peer model agent is required"
    )
    response = _text(401, reason)
    response.headers["WWW-Authenticate"] = contract.challenge(unknown_node=unknown_node)
    return response


class Streams:
    """At most ``per_source`` streams at once per asking node (a count per node, dropped at
    zero, so nodes that stopped asking cost nothing); a node over it waits its turn."""

    def __init__(self, per_source: int) -> None:
        self.per_source = per_source
        self._held: dict[str, int] = {}
        self._freed = anyio.Event()

    async def acquire(self, node: str) -> None:
        while self._held.get(node, 0) >= self.per_source:
            await self._freed.wait()
        self._held[node] = self._held.get(node, 0) + 1

    def release(self, node: str) -> None:
        left = self._held[node] - 1
        if left:
            self._held[node] = left
        else:
            del self._held[node]
        self._freed.set()
        self._freed = anyio.Event()

    def held(self, node: str) -> int:
        return self._held.get(node, 0)


@asynccontextmanager
async def serve(
    server: PeerServer, *, shutdown_timeout_s: float = 2.0
) -> AsyncIterator[serving.Server]:
    """Serve ``server``'s routes on its settings' address and port until the block exits.

    :raises ServingFailed: the port cannot be bound.
    """
    app = web.Application()
    app.router.add_get("/peer/v1/trees/{hex}", server.tree)
    app.router.add_get("/peer/v1/trees/{hex}/files/{path:.+}", server.file)
    runner = listening.runner_for(app)
    await runner.setup()
    host, port = server.settings.bind_address, server.settings.port or 0
    try:
        bound = await listening.serve_tcp(runner, host, port)
    except OSError as e:
        raise serving.ServingFailed(
            f"cannot serve peers on {host}:{port}: {e.strerror or e}"
        ) from e
    try:
        yield serving.Server(host=host, port=bound, scheme="http")
    finally:
        with anyio.move_on_after(shutdown_timeout_s, shield=True):
            await runner.cleanup()

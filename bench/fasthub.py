"""A fast Hub stand-in for the benchmarks: every answer built in memory before the first request.

Why not :mod:`hub.testing`: that one is aiohttp with a file per answer, written to be faithful
for tests; as a benchmark peer it cost about as much CPU per request as the clients it served,
so a fast client measured the server. This one parses a request head with one ``find`` and
answers from a dict of ready bytes: keep-alive, pipelined requests answered in order,
``TCP_NODELAY`` on every connection (no Nagle stall between a head and its body), a listen
backlog of 1,024, and flow control (a large body is written a MiB at a time, only while the
transport takes it), on uvloop when it is installed.

What it answers, as the Hub does for the calls the contenders make (``mm pull``, curl,
``huggingface_hub.snapshot_download``), for each repository it was given:

- ``GET /api/models/<repo>/revision/<rev>``: ``{"id", "sha", "siblings"}``;
- ``GET /api/models/<repo>/tree/<commit>``: the whole listing in one page (query ignored);
- ``GET|HEAD /<repo>/resolve/<rev>/<path>``: a 302 to ``/_cdn/<sha256>`` with the metadata
  headers ``huggingface_hub`` reads (``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``,
  ``X-Linked-Size``), as the Hub redirects an LFS file to its CDN;
- ``GET|HEAD /_cdn/<sha256>``: the bytes, ``Range: bytes=a-b`` answered 206 (with the same
  metadata headers: ``huggingface_hub`` follows a redirect to the same host and reads them there);
- ``GET /_bench/cpu``: this process's CPU seconds so far (user + system), so a bench reports
  the server's CPU beside each contender's.

Not a test peer: no errors beyond 404/416, no authentication, no chunked bodies.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import socket
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FastHub", "Repo", "make_repo", "serve_forever"]

MiB = 1024 * 1024
_PIECE = MiB
"""A large body is handed to the transport this many bytes at a time."""
_INLINE = 256 * 1024
"""Bodies up to this size are joined with their head into one write."""


@dataclass
class Repo:
    """A repository at one commit: path -> content."""

    name: str
    commit: str
    files: dict[str, bytes]


def make_repo(name: str, count: int, size: int, seed: int = 0) -> Repo:
    """``count`` files of ``size`` random bytes (``model-NNNNN.safetensors``) plus a small
    ``config.json`` and ``README.md``: what ``bench_models`` pulls."""
    rnd = random.Random(seed)
    files = {f"model-{i:05d}.safetensors": rnd.randbytes(size) for i in range(count)}
    files["config.json"] = b'{"model_type": "bench"}' + b" " * 77
    files["README.md"] = b"# bench\n\n"
    commit = hashlib.sha1(f"{name}:{count}:{size}:{seed}".encode()).hexdigest()
    return Repo(name, commit, files)


@dataclass
class FastHub:
    """The ready answers; :meth:`answer` maps a request head to the bytes to send."""

    repos: Iterable[Repo]
    port: int = 0
    _plain: dict[str, bytes] = field(default_factory=dict)
    _blobs: dict[str, tuple[memoryview, bytes]] = field(default_factory=dict)
    _redirects: dict[str, tuple[str, bytes]] = field(default_factory=dict)

    def prepare(self, port: int) -> None:
        """Build every answer once the port (part of each redirect's ``Location``) is known."""
        self.port = port
        for repo in self.repos:
            entries: list[dict[str, Any]] = []
            for path, data in sorted(repo.files.items()):
                sha = hashlib.sha256(data).hexdigest()
                git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                entries.append(
                    {
                        "type": "file",
                        "path": path,
                        "size": len(data),
                        "oid": git,
                        "lfs": {"oid": sha, "size": len(data), "pointerSize": 134},
                    }
                )
                meta = (
                    f'X-Repo-Commit: {repo.commit}\r\nETag: "{git}"\r\n'
                    f'X-Linked-Etag: "{sha}"\r\nX-Linked-Size: {len(data)}\r\n'
                )
                self._blobs[sha] = (memoryview(data), meta.encode())
                for rev in (repo.commit, "main"):
                    self._redirects[f"/{repo.name}/resolve/{rev}/{path}"] = (sha, meta.encode())
            siblings = [{"rfilename": p} for p in sorted(repo.files)]
            revision = {"id": repo.name, "sha": repo.commit, "siblings": siblings}
            for rev in (repo.commit, "main"):
                self._plain[f"/api/models/{repo.name}/revision/{rev}"] = _json(revision)
            self._plain[f"/api/models/{repo.name}/tree/{repo.commit}"] = _json(entries)

    def answer(self, head: bytes) -> list[bytes | memoryview]:
        """The pieces that answer one request head (its status line and headers)."""
        line_end = head.find(b"\r\n")
        method, _, rest = head[: line_end if line_end >= 0 else len(head)].partition(b" ")
        target = rest.rpartition(b" ")[0].decode("latin-1")
        path = target.partition("?")[0]
        bodiless = method == b"HEAD"
        if path.startswith("/_cdn/"):
            found = self._blobs.get(path[6:])
            if found is None:
                return [_status(404, b"", bodiless)]
            return self._ranged(*found, head, bodiless)
        redirect = self._redirects.get(path)
        if redirect is not None:
            sha, meta = redirect
            location = f"Location: http://127.0.0.1:{self.port}/_cdn/{sha}\r\n".encode()
            return [b"HTTP/1.1 302 Found\r\n" + meta + location + b"Content-Length: 0\r\n\r\n"]
        if path == "/_bench/cpu":
            t = time.process_time()
            return [_status(200, b"%.6f" % t, False)]
        body = self._plain.get(path)
        if body is None:
            return [_status(404, b"", bodiless)]
        return [_status(200, body, bodiless, b"Content-Type: application/json\r\n")]

    def _ranged(
        self, blob: memoryview, meta: bytes, head: bytes, bodiless: bool
    ) -> list[bytes | memoryview]:
        size = len(blob)
        at = head.lower().find(b"\r\nrange: bytes=")
        if at < 0:
            start, end, code = 0, size, b"200 OK"
        else:
            spec = head[at + 15 :].split(b"\r\n", 1)[0]
            first, _, last = spec.partition(b"-")
            start = int(first)
            end = min(int(last) + 1, size) if last else size
            if start >= size or end <= start:
                return [_status(416, b"", bodiless)]
            code = b"206 Partial Content"
        extra = b""
        if code[:3] != b"200":
            extra = b"Content-Range: bytes %d-%d/%d\r\n" % (start, end - 1, size)
        top = b"HTTP/1.1 %s\r\n%sAccept-Ranges: bytes\r\n%sContent-Length: %d\r\n\r\n" % (
            code,
            meta,
            extra,
            end - start,
        )
        if bodiless:
            return [top]
        body = blob[start:end]
        if len(body) <= _INLINE:
            return [top + body]
        return [top, body]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _status(code: int, body: bytes, bodiless: bool, extra: bytes = b"") -> bytes:
    reason = {200: b"OK", 404: b"Not Found", 416: b"Range Not Satisfiable"}[code]
    head = b"HTTP/1.1 %d %s\r\n%sContent-Length: %d\r\n\r\n" % (code, reason, extra, len(body))
    return head if bodiless else head + body


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed as they arrive, answers queued in order."""

    def __init__(self, hub: FastHub) -> None:
        self.hub = hub
        self.buf = bytearray()
        self.out: deque[bytes | memoryview] = deque()
        self.paused = False
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        start = 0
        while (end := buf.find(b"\r\n\r\n", start)) >= 0:
            self.out.extend(self.hub.answer(bytes(buf[start:end])))
            start = end + 4
        if start:
            del buf[:start]
        self._flush()

    def _flush(self) -> None:
        out = self.out
        small: list[bytes | memoryview] = []
        while out and not self.paused:
            piece = out[0]
            if len(piece) <= _INLINE:
                small.append(out.popleft())
                continue
            if small:
                self.transport.writelines(small)
                small = []
            view = memoryview(piece)
            self.transport.write(view[:_PIECE])
            if len(view) > _PIECE:
                out[0] = view[_PIECE:]
            else:
                out.popleft()
        if small:
            self.transport.writelines(small)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._flush()


async def serve_forever(hub: FastHub, ready: Any) -> None:
    """Listen on a loopback port (backlog 1,024), call ``ready(port)``, serve until cancelled."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    hub.prepare(port)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(hub), sock=sock, backlog=1024)
    ready(port)
    async with server:
        await asyncio.Future()


def run(hub: FastHub, ready: Any, until: Any) -> None:
    """Serve ``hub`` in this process until ``until()`` (a blocking call, run in a thread)
    returns; uvloop when installed."""

    async def main() -> None:
        task = asyncio.ensure_future(serve_forever(hub, ready))
        await asyncio.get_running_loop().run_in_executor(None, until)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())

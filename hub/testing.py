"""A fake Hugging Face Hub for tests and benchmarks: a real HTTP server on loopback.

Two aiohttp servers: the **hub** (``/api/models/.../revision``, paged ``/tree`` with
``Link: rel="next"``, ``/{repo}/resolve/{commit}/{path}``) and a **CDN** on another port that
LFS files redirect to, as huggingface.co does. The CDN records the ``Authorization`` header of
every request so a test can prove the token never left the hub's origin.

Content lives on disk (``<root>/blobs/<sha256>``) and is served with ``sendfile`` and native
``Range`` support, so a benchmark can serve gigabytes without holding them in memory. Faults
are opt-in: a connection dropped after N bytes (once per path), corrupted bytes, a gate that
holds file responses until a test opens it, errors with the Hub's ``X-Error-*`` headers.

Test harness only: production code never imports this module.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
from aiohttp import web

__all__ = ["FakeHub", "Seen", "git_blob_sha1", "serving"]

_CHUNK = 256 * 1024


def git_blob_sha1(content: bytes) -> str:
    """Git's object id of a blob: SHA-1 of ``"blob <size>\\0"`` + content."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class _File:
    path: str
    size: int
    sha256: str
    gitsha1: str
    lfs: bool


@dataclass
class _Repo:
    revisions: dict[str, str] = field(default_factory=dict)
    trees: dict[str, dict[str, _File]] = field(default_factory=dict)
    token: str | None = None
    extra_entries: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Seen:
    """One request as the server saw it."""

    host: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    """Repositories and fault switches; serve it with :func:`serving`."""

    def __init__(self, root: Path, *, page_size: int = 50, lfs_threshold: int = 1024) -> None:
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        self.page_size = page_size
        self.lfs_threshold = lfs_threshold
        self.repos: dict[str, _Repo] = {}
        self.break_once: dict[str, int] = {}
        """path -> bytes after which the first response for it is cut off."""
        self.corrupt: set[str] = set()
        """Paths whose bytes are served with one byte flipped."""
        self.ranges = True
        """False: ignore ``Range`` and always answer 200 with the whole file."""
        self.gate: anyio.Event | None = None
        """When set to an Event, file responses wait for it before sending any byte."""
        self.next_link: Callable[[int], str] | None = None
        """A hostile paging: maps a tree page's cursor to the ``next`` link it sends (always one,
        even past the last entry), instead of the honest link to the following page."""
        self.seen: list[Seen] = []
        self._counter = itertools.count(1)

    # ------------------------------------------------------------------ content

    def add(
        self,
        repository: str,
        files: Mapping[str, bytes] | Iterable[tuple[str, bytes]],
        *,
        revision: str = "main",
        token: str | None = None,
    ) -> str:
        """Create (or add a commit to) ``repository``; returns the commit ``revision`` names."""
        items = files.items() if isinstance(files, Mapping) else files
        return self.add_streams(
            repository, ((p, len(c), [c]) for p, c in items), revision=revision, token=token
        )

    def add_streams(
        self,
        repository: str,
        files: Iterable[tuple[str, int, Iterable[bytes]]],
        *,
        revision: str = "main",
        token: str | None = None,
    ) -> str:
        """Like :meth:`add` with each file given as (path, size, chunks): for big benchmarks."""
        repo = self.repos.setdefault(repository, _Repo())
        repo.token = token
        commit = hashlib.sha1(f"{repository}@{revision}#{next(self._counter)}".encode()).hexdigest()
        tree: dict[str, _File] = {}
        for path, size, chunks in files:
            tree[path] = self._store(path, size, chunks)
        repo.trees[commit] = tree
        repo.revisions[revision] = commit
        return commit

    def _store(self, path: str, size: int, chunks: Iterable[bytes]) -> _File:
        sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        tmp = self.root / "blobs" / f"incoming-{next(self._counter)}"
        with tmp.open("wb") as out:
            for chunk in chunks:
                sha256.update(chunk)
                sha1.update(chunk)
                out.write(chunk)
        digest = sha256.hexdigest()
        tmp.replace(self.root / "blobs" / digest)
        return _File(path, size, digest, sha1.hexdigest(), lfs=size >= self.lfs_threshold)

    def blob(self, repository: str, path: str) -> Path:
        repo = self.repos[repository]
        commit = repo.revisions["main"]
        return self.root / "blobs" / repo.trees[commit][path].sha256

    def entries(self, repository: str, commit: str) -> list[dict[str, Any]]:
        """The tree listing as the Hub returns it (directories included)."""
        repo = self.repos[repository]
        out: list[dict[str, Any]] = []
        dirs: set[str] = set()
        for f in sorted(repo.trees[commit].values(), key=lambda f: f.path):
            parts = f.path.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    out.append({"type": "directory", "path": d, "oid": "0" * 40, "size": 0})
            entry: dict[str, Any] = {"type": "file", "path": f.path, "size": f.size}
            entry["oid"] = f.gitsha1
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            out.append(entry)
        return out + repo.extra_entries

    # ------------------------------------------------------------------ handlers

    def _record(self, request: web.Request) -> None:
        self.seen.append(
            Seen(
                request.host,
                request.path,
                request.headers.get("Range"),
                request.headers.get("Authorization"),
            )
        )

    def _authorize(self, request: web.Request, repository: str) -> _Repo:
        repo = self.repos.get(repository)
        if repo is None:
            raise _error(404, "RepoNotFound", "Repository not found")
        if repo.token is not None:
            got = request.headers.get("Authorization")
            if got is None:
                raise _error(401, "RepoNotFound", "Invalid username or password.")
            if got != f"Bearer {repo.token}":
                raise _error(403, "GatedRepo", "Access to this repository is restricted.")
        return repo

    async def api(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        raw = request.rel_url.raw_path.removeprefix("/api/models/")
        for marker in ("/revision/", "/tree/"):
            if marker in raw:
                repository, _, rest = raw.partition(marker)
                repo = self._authorize(request, unquote(repository))
                if marker == "/revision/":
                    wanted = unquote(rest)  # a commit names itself, as on the Hub
                    commit = wanted if wanted in repo.trees else repo.revisions.get(wanted)
                    if commit is None:
                        raise _error(404, "RevisionNotFound", f"Invalid rev id: {unquote(rest)}")
                    siblings = [{"rfilename": p} for p in sorted(repo.trees[commit])]
                    return web.json_response(
                        {"id": unquote(repository), "sha": commit, "siblings": siblings}
                    )
                return self._tree_page(request, unquote(repository), repo, unquote(rest))
        raise _error(404, "EntryNotFound", "no such API")

    def _tree_page(
        self, request: web.Request, repository: str, repo: _Repo, commit: str
    ) -> web.Response:
        if commit not in repo.trees:
            raise _error(404, "RevisionNotFound", f"Invalid rev id: {commit}")
        entries = self.entries(repository, commit)
        start = int(request.query.get("cursor", "0"))
        page = entries[start : start + self.page_size]
        headers = {}
        if self.next_link is not None:
            headers["Link"] = f'<{self.next_link(start)}>; rel="next"'
        elif start + self.page_size < len(entries):
            nxt = request.url.update_query(cursor=str(start + self.page_size))
            headers["Link"] = f'<{nxt}>; rel="next"'
        return web.Response(body=json.dumps(page), content_type="application/json", headers=headers)

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        raw = request.rel_url.raw_path.lstrip("/")
        repository, _, rest = raw.partition("/resolve/")
        commit, _, path = rest.partition("/")
        repo = self._authorize(request, unquote(repository))
        f = repo.trees.get(unquote(commit), {}).get(unquote(path))
        if f is None:
            raise _error(404, "EntryNotFound", f"{unquote(path)} does not exist")
        # The metadata huggingface_hub reads from the resolve answer (before any redirect).
        meta = {"X-Repo-Commit": unquote(commit), "ETag": f'"{f.gitsha1}"'}
        if f.lfs:
            meta |= {"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size)}
        if f.lfs and self.cdn_url:
            raise web.HTTPFound(f"{self.cdn_url}/blobs/{f.sha256}?path={path}", headers=meta)
        response = await self._send(request, f.path, f.sha256)
        response.headers.update(meta)
        return response

    async def cdn(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        digest = request.match_info["digest"]
        return await self._send(request, unquote(request.query.get("path", "")), digest)

    async def _send(self, request: web.Request, path: str, digest: str) -> web.StreamResponse:
        if self.gate is not None:
            await self.gate.wait()
        blob = self.root / "blobs" / digest
        if path not in self.break_once and path not in self.corrupt:
            if not self.ranges:
                return web.FileResponse(blob, headers={"Accept-Ranges": "none"}, chunk_size=_CHUNK)
            return web.FileResponse(blob, chunk_size=_CHUNK)
        return await self._send_faulty(request, path, blob)

    async def _send_faulty(self, request: web.Request, path: str, blob: Path) -> web.StreamResponse:
        size = blob.stat().st_size  # noqa: ASYNC240 - a test harness, local and tiny
        start, end = _range(request.headers.get("Range"), size) if self.ranges else (0, size)
        response = web.StreamResponse(status=206 if (start, end) != (0, size) else 200)
        response.content_length = end - start
        if response.status == 206:
            response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        await response.prepare(request)
        cut = self.break_once.pop(path, None)
        with blob.open("rb") as src:
            src.seek(start)
            data = src.read(end - start)
        if path in self.corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        if cut is not None:
            await response.write(data[: max(0, cut - start)])
            await anyio.sleep(0.05)  # let the client read what was sent before the cut
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write(data)
        await response.write_eof()
        return response

    cdn_url: str = ""


def _range(header: str | None, size: int) -> tuple[int, int]:
    if not header or not header.startswith("bytes="):
        return 0, size
    first, _, last = header.removeprefix("bytes=").partition("-")
    return int(first), (int(last) + 1 if last else size)


def _error(status: int, code: str, message: str) -> web.HTTPException:
    headers = {"X-Error-Code": code, "X-Error-Message": message}
    kinds: dict[int, type[web.HTTPException]] = {
        401: web.HTTPUnauthorized,
        403: web.HTTPForbidden,
        404: web.HTTPNotFound,
    }
    return kinds.get(status, web.HTTPInternalServerError)(headers=headers, text=message)


@dataclass(frozen=True)
class Endpoints:
    hub: str
    cdn: str


async def _start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server: Any = site._server
    port = server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def serving(hub: FakeHub) -> AsyncIterator[Endpoints]:
    """Serve ``hub`` and its CDN on two loopback ports until the block exits."""
    cdn_app = web.Application()
    cdn_app.router.add_get("/blobs/{digest}", hub.cdn)
    hub_app = web.Application()
    hub_app.router.add_get("/api/models/{tail:.*}", hub.api)
    hub_app.router.add_get("/{tail:.*}", hub.resolve)
    cdn_runner, cdn_url = await _start(cdn_app)
    try:
        hub_runner, hub_url = await _start(hub_app)
        hub.cdn_url = cdn_url  # another port: another origin, so no token
        try:
            yield Endpoints(hub_url, hub.cdn_url)
        finally:
            with anyio.CancelScope(shield=True):
                await hub_runner.cleanup()
    finally:
        with anyio.CancelScope(shield=True):
            await cdn_runner.cleanup()

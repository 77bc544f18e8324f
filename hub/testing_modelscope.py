"""A fake ModelScope for tests: a real aiohttp server on loopback, built from public facts.

Sources of the shapes it answers (facts, read for this; no code taken from them):

- ModelScope's SDK, ``modelscope/hub/api.py`` (``HubApi.get_model_files``: ``GET
  /api/v1/models/<id>/repo/files?Revision=<rev>&Recursive=<bool>[&Root=<dir>]``, the answer
  ``{"Code": 200, "Data": {"Files": [...]}}`` whose entries carry ``Name``, ``Path``, ``Type``
  (``blob`` or ``tree``), ``Size``, ``Sha256``, ``Revision``; the ``m_session_id`` cookie it sends
  as credential), ``modelscope/hub/constants.py`` (``MODELSCOPE_DOMAIN``,
  ``MODELSCOPE_API_TOKEN`` via ``login``, ``FILE_HASH = 'Sha256'``) and
  ``modelscope/hub/utils/utils.py`` (``get_endpoint``: scheme + domain);
- published clients of the API: file bytes at ``/api/v1/models/<id>/repo?Revision=<commit>&
  FilePath=<path>``; the commit history ``/api/v1/models/<id>/commits?Ref=<rev>&PageNumber=1&
  PageSize=1`` answering ``{"Code": 200, "Success": true, "Data": {"Commit": [{"Id": <40 hex>}],
  "TotalCount": n}}``; the listing cut at 3,000 entries with no continuation; ``GET
  /openapi/v1/users/me`` with ``Authorization: Bearer`` answering ``{"success": true, "data":
  {"username": ...}}`` or 401 ``{"success": false, "code": "InvalidAuthentication", ...}``;
- git's smart-HTTP protocol (``/<id>.git/info/refs?service=git-upload-pack``, pkt-lines), what
  ``git ls-remote`` reads, with Basic credentials ``oauth2:<token>``.

What is assumed where no public source says: an unknown ref answers an empty ``Commit`` list;
a private repository answers 401 without a credential and 403 with a wrong one.

Faults are opt-in: a file served with one byte flipped (:attr:`FakeModelScope.corrupt`), git refs
that disagree with the API (:attr:`FakeModelScope.git_override`), entries added to every listing
(:attr:`FakeModelScope.extra`). Every request is recorded
(:attr:`FakeModelScope.seen`) so a test can count file requests and check credentials.

Test harness only: production code never imports this module.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from aiohttp import web

__all__ = ["FakeModelScope", "Seen", "serving"]


@dataclass
class _Repo:
    refs: dict[str, str] = field(default_factory=dict)
    """Branch or tag -> commit."""
    trees: dict[str, dict[str, bytes]] = field(default_factory=dict)
    token: str | None = None


@dataclass(frozen=True)
class Seen:
    """One request as the server saw it."""

    path: str
    query: Mapping[str, str]
    authorization: str | None
    cookie: str | None


class FakeModelScope:
    """Repositories and fault switches; serve it with :func:`serving`."""

    def __init__(self, *, cap: int = 3000) -> None:
        self.cap = cap
        """Entries one ``repo/files`` answer holds at most (the real API's 3,000)."""
        self.repos: dict[str, _Repo] = {}
        self.users: dict[str, str] = {}
        """Token -> user name: the tokens ``/openapi/v1/users/me`` accepts."""
        self.corrupt: set[str] = set()
        self.git_override: dict[str, str] = {}
        """Ref -> commit the git refs advertise instead of the true one."""
        self.tags: set[str] = set()
        """Refs advertised by git as annotated tags (a tag object, then the peeled commit)."""
        self.deny_once: set[str] = set()
        """``Root`` values (``""``: the repository) whose next listing answers 403, once: the
        spurious denial ModelScope's SDK documents."""
        self.extra: list[dict[str, Any]] = []
        """Raw entries appended to every ``repo/files`` answer (a hostile listing)."""
        self.seen: list[Seen] = []
        self._counter = itertools.count(1)

    def add(
        self,
        repository: str,
        files: Mapping[str, bytes],
        *,
        revision: str = "master",
        token: str | None = None,
    ) -> str:
        """Commit ``files`` to ``repository`` under ``revision``; returns the commit id."""
        repo = self.repos.setdefault(repository, _Repo())
        repo.token = token
        if token:
            self.users.setdefault(token, "someone")
        commit = hashlib.sha1(f"{repository}#{next(self._counter)}".encode()).hexdigest()
        repo.trees[commit] = dict(files)
        repo.refs[revision] = commit
        return commit

    def file_requests(self) -> list[Seen]:
        return [s for s in self.seen if s.path.endswith("/repo")]

    # ------------------------------------------------------------------ handlers

    def _record(self, request: web.Request) -> None:
        self.seen.append(
            Seen(
                request.path,
                dict(request.query),
                request.headers.get("Authorization"),
                request.cookies.get("m_session_id"),
            )
        )

    def _repo(self, request: web.Request, *, git: bool = False) -> tuple[str, _Repo]:
        repository = f"{request.match_info['owner']}/{request.match_info['name']}"
        repo = self.repos.get(repository)
        if repo is None:
            raise _error(404, f"model {repository} not found")
        if repo.token is None:
            return repository, repo
        if git:
            auth = request.headers.get("Authorization", "")
            expected = "Basic " + base64.b64encode(f"oauth2:{repo.token}".encode()).decode()
            given = auth or None
        else:
            expected = repo.token
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
            given = request.cookies.get("m_session_id") or bearer or None
            auth = given or ""
        if given is None:
            raise _error(401, "login required")
        if auth != expected:
            raise _error(403, "no access to this model")
        return repository, repo

    async def commits(self, request: web.Request) -> web.Response:
        self._record(request)
        _, repo = self._repo(request)
        ref = request.query.get("Ref", "master")
        commit = ref if ref in repo.trees else repo.refs.get(ref)
        found = [] if commit is None else [{"Id": commit, "ShortId": commit[:8], "Title": "c"}]
        data = {"Commit": found, "TotalCount": len(found)}
        return web.json_response({"Code": 200, "Success": True, "Message": "", "Data": data})

    async def refs(self, request: web.Request) -> web.Response:
        self._record(request)
        _, repo = self._repo(request, git=True)
        lines = [b"# service=git-upload-pack\n"]
        body = _pkt(lines[0]) + b"0000"
        for ref, commit in sorted(repo.refs.items()):
            commit = self.git_override.get(ref, commit)
            if ref in self.tags:
                tag_object = hashlib.sha1(f"tag {ref}".encode()).hexdigest()
                body += _pkt(f"{tag_object} refs/tags/{ref}\n".encode())
                body += _pkt(f"{commit} refs/tags/{ref}^{{}}\n".encode())
            else:
                body += _pkt(f"{commit} refs/heads/{ref}\n".encode())
        body += b"0000"
        return web.Response(body=body, content_type="application/x-git-upload-pack-advertisement")

    async def files(self, request: web.Request) -> web.Response:
        self._record(request)
        _, repo = self._repo(request)
        tree = repo.trees.get(request.query.get("Revision", ""))
        if tree is None:
            raise _error(404, "revision not found")
        recursive = request.query.get("Recursive", "false").lower() == "true"
        root = request.query.get("Root", "").strip("/")
        if root in self.deny_once:
            self.deny_once.discard(root)
            raise _error(403, "access denied")
        listed = (_listing(tree, root, recursive) + self.extra)[: self.cap]
        data = {"Files": listed, "LatestCommitter": None}
        return web.json_response({"Code": 200, "Success": True, "Message": "", "Data": data})

    async def download(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        _, repo = self._repo(request)
        tree = repo.trees.get(request.query.get("Revision", ""), {})
        path = request.query.get("FilePath", "")
        if path not in tree:
            raise _error(404, f"{path} not found")
        data = tree[path]
        if path in self.corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start, end = _range(request.headers.get("Range"), len(data))
        response = web.Response(
            body=data[start:end], status=200 if (start, end) == (0, len(data)) else 206
        )
        if response.status == 206:
            response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        response.headers["Accept-Ranges"] = "bytes"
        return response

    async def me(self, request: web.Request) -> web.Response:
        self._record(request)
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.users:
            return web.json_response(
                {
                    "success": False,
                    "code": "InvalidAuthentication",
                    "message": "Invalid authentication: missing or invalid Authorization header",
                },
                status=401,
            )
        user = {"username": self.users[token], "email": "", "nickname": ""}
        return web.json_response({"success": True, "data": user})


def _pkt(line: bytes) -> bytes:
    return b"%04x" % (len(line) + 4) + line


def _listing(tree: Mapping[str, bytes], root: str, recursive: bool) -> list[dict[str, Any]]:
    """The entries under ``root`` (directories as ``tree``), sorted by path, as the API names
    them: ``Path`` from the repository root, ``Name`` the last segment."""
    prefix = root + "/" if root else ""
    out: dict[str, dict[str, Any]] = {}
    for path, content in sorted(tree.items()):
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        for depth in range(1, len(parts)):
            if not recursive and depth > 1:
                break
            d = prefix + "/".join(parts[:depth])
            out.setdefault(d, _entry(d, "tree", 0, ""))
        if recursive or len(parts) == 1:
            digest = hashlib.sha256(content).hexdigest()
            out[path] = _entry(path, "blob", len(content), digest)
    return [out[k] for k in sorted(out)]


def _entry(path: str, kind: str, size: int, sha256: str) -> dict[str, Any]:
    return {
        "Name": path.rsplit("/", 1)[-1],
        "Path": path,
        "Type": kind,
        "Size": size,
        "Sha256": sha256,
        "Mode": "100644" if kind == "blob" else "40000",
        "IsLFS": size >= 1024,
        "Revision": "",
    }


def _range(header: str | None, size: int) -> tuple[int, int]:
    if not header or not header.startswith("bytes="):
        return 0, size
    first, _, last = header.removeprefix("bytes=").partition("-")
    return int(first), min(size, int(last) + 1) if last else size


def _error(status: int, message: str) -> web.HTTPException:
    kinds: dict[int, type[web.HTTPException]] = {
        401: web.HTTPUnauthorized,
        403: web.HTTPForbidden,
        404: web.HTTPNotFound,
    }
    body = f'{{"Code": {status}, "Success": false, "Message": "{message}"}}'
    return kinds[status](text=body, content_type="application/json")


@asynccontextmanager
async def serving(fake: FakeModelScope) -> AsyncIterator[str]:
    """Serve ``fake`` on a loopback port until the block exits; yields its endpoint URL."""
    app = web.Application()
    models = "/api/v1/models/{owner}/{name}"
    app.router.add_get(f"{models}/commits", fake.commits)
    app.router.add_get(f"{models}/repo/files", fake.files)
    app.router.add_get(f"{models}/repo", fake.download)
    app.router.add_get("/openapi/v1/users/me", fake.me)
    app.router.add_get("/{owner}/{name}.git/info/refs", fake.refs)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server: Any = site._server
        port = server.sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()

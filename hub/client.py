"""A small Hugging Face Hub HTTP client: revision, paged tree listing and file bytes.

Only what the manifest and the downloads need, on one :class:`hub.http.Client` (keep-alive
connections) per process. Every transport error is mapped here to :mod:`hub.errors`
(``raise ... from e``) so callers see only reasons.

Credentials: a token is sent only to the endpoint's own origin. Redirects are followed by hand
(at most :data:`MAX_REDIRECTS`) and the ``Authorization`` header is dropped as soon as a hop
leaves that origin or goes from https to http — the CDN a resolve URL redirects to never sees it.

Proxies are chosen per request (a redirect may leave for a host ``NO_PROXY`` names), and with
``offline`` set (``HF_HUB_OFFLINE``) no request is made at all: every call fails as
SourceUnavailable saying so, so cached trees keep serving and nothing waits on a network.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

import msgspec

from hub import http
from hub.endpoints import HubEnvironment, bypasses
from hub.errors import (
    AccessDenied,
    HubError,
    IntegrityMismatch,
    RevisionNotFound,
    SourceUnavailable,
)
from hub.manifest import Entry
from hub.urls import Url

__all__ = ["Body", "HubClient", "HubSettings", "client", "file_body", "range_header"]

USER_AGENT: Final = "gpustack-operator"
MAX_REDIRECTS: Final = 10
MAX_TREE_ENTRIES: Final = 100_000
MAX_TREE_PAGES: Final = 2_000
"""Pages one tree listing may follow: :data:`MAX_TREE_ENTRIES` even at 50 entries a page (the
Hub's smallest page, an expanded listing's; unexpanded pages hold 1,000). Beyond it, or on a
``next`` link to a page already fetched, the listing fails: a hostile or broken server's chain
of pages must end, not loop for ever."""
MAX_PAGE_BYTES: Final = 16 * 1024 * 1024
_GATED_OID: Final = "*" * 64


class HubSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the Hub is and how to reach it; the token is per call, never here."""

    endpoint: str = "https://huggingface.co"
    proxy: str | None = None
    """The proxy of ``https`` requests (``HTTPS_PROXY``), or None for a direct connection."""
    http_proxy: str | None = None
    """The proxy of plain ``http`` requests (``HTTP_PROXY``)."""
    no_proxy: tuple[str, ...] = ()
    """``NO_PROXY`` entries: hosts reached directly (see :func:`hub.endpoints.bypasses`)."""
    offline: bool = False
    """``HF_HUB_OFFLINE``: refuse every request."""

    @classmethod
    def of(cls, endpoint: str, env: HubEnvironment) -> HubSettings:
        """Settings for ``endpoint`` under the environment's proxies and offline switch."""
        return cls(
            endpoint=endpoint,
            proxy=env.https_proxy,
            http_proxy=env.http_proxy,
            no_proxy=env.no_proxy,
            offline=env.offline,
        )

    ca_file: str | None = None
    """A PEM bundle that replaces the system CAs (a private Hub mirror)."""
    connect_timeout_s: float = 30.0
    stall_timeout_s: float = 30.0
    """A read that gets no byte for this long fails as SourceUnavailable (and is retried)."""
    max_connections: int = 64


class _Lfs(msgspec.Struct, frozen=True):
    oid: str
    size: int


class _TreeEntry(msgspec.Struct, frozen=True):
    type: str
    path: str
    size: int = 0
    oid: str = ""
    lfs: _Lfs | None = None


class _Revision(msgspec.Struct, frozen=True):
    sha: str


_TREE = msgspec.json.Decoder(list[_TreeEntry])
_REVISION = msgspec.json.Decoder(_Revision)


def _entry(raw: _TreeEntry) -> Entry | None:
    if raw.type == "directory":
        return None
    if raw.lfs is None:
        return Entry("gitsha1", raw.oid, raw.size, raw.path)
    if raw.lfs.oid == _GATED_OID:
        raise AccessDenied(f"{raw.path}: the repository is gated for this token")
    if raw.lfs.size != raw.size:
        raise IntegrityMismatch(f"{raw.path}: LFS size {raw.lfs.size} != file size {raw.size}")
    return Entry("sha256", raw.lfs.oid, raw.size, raw.path)


def _check_page(url: Url, fetched: set[str], what: str) -> None:
    """Refuse a page already fetched (a ``next`` that loops) or one past :data:`MAX_TREE_PAGES`;
    ``fetched`` is the listing's set of page URLs so far, ``url`` is added to it."""
    key = str(url)
    if key in fetched:
        raise SourceUnavailable(f"{what}: the next-page link repeats {url.target[:200]} (a loop)")
    if len(fetched) >= MAX_TREE_PAGES:
        raise SourceUnavailable(f"{what}: over {MAX_TREE_PAGES} pages")
    fetched.add(key)


def _failure(status: int, headers: Mapping[str, str], what: str) -> HubError:
    code = headers.get("x-error-code", "")
    detail = headers.get("x-error-message", "") or f"HTTP {status}"
    message = f"{what}: {detail}" + (f" ({code})" if code else "")
    if status == 404 and code == "RevisionNotFound":
        return RevisionNotFound(message)
    if code == "GatedRepo" or status in (401, 403, 404):
        return AccessDenied(message)
    return SourceUnavailable(message)


@dataclass
class Body:
    """A file response being read: where it starts, the file's total size, the bytes."""

    start: int
    """The offset of the first byte (0 for a whole-file 200)."""
    total: int | None
    """The file size the server claims (Content-Range total, or Content-Length of a 200)."""
    _response: http.Response

    async def pieces(self) -> AsyncIterator[bytes | memoryview]:
        """Yield the body as the network delivered it: no joining, so no copy of any byte.

        :raises SourceUnavailable: the connection broke or stalled (the caller resumes).
        """
        try:
            async for piece in self._response.pieces():
                yield piece
        except (http.HttpError, OSError) as e:
            raise SourceUnavailable(f"download interrupted: {e or type(e).__name__}") from e

    async def chunks(self, size: int) -> AsyncIterator[bytes]:
        """Yield the body in pieces of at most ``size`` bytes.

        :raises SourceUnavailable: the connection broke or stalled (the caller resumes).
        """
        async for piece in self.pieces():
            view = memoryview(piece)
            for at in range(0, len(view), size):
                yield bytes(view[at : at + size])


class HubClient:
    """Hub calls on one shared session; create with :func:`client`."""

    def __init__(self, transport: http.Client, settings: HubSettings) -> None:
        self._http = transport
        self._settings = settings
        try:
            self._endpoint = Url(settings.endpoint)
        except ValueError as e:
            raise SourceUnavailable(f"the Hub endpoint is not usable: {e}") from e
        self._origin = self._endpoint.origin
        self._base = settings.endpoint.rstrip("/")

    @property
    def settings(self) -> HubSettings:
        return self._settings

    def _url(self, path: str) -> Url:
        """``path`` (percent-encoded) under the endpoint, without parsing the endpoint again
        (one URL a file: its cost shows in a pull of many small files)."""
        try:
            return self._endpoint.under(path)
        except ValueError:  # an endpoint with a query: join it as text, as ever
            return Url(f"{self._base}{path}")

    def _headers(self, url: Url, token: str | None) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if token and url.origin == self._origin:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _proxy(self, url: Url) -> str | None:
        s = self._settings
        if bypasses(s.no_proxy, url.host, url.explicit_port):
            return None
        return s.proxy if url.scheme == "https" else s.http_proxy

    @asynccontextmanager
    async def _get(
        self, url: Url, token: str | None, extra: Mapping[str, str] | None = None
    ) -> AsyncIterator[http.Response]:
        """GET following redirects by hand; the token only goes to the endpoint's origin."""
        response = await self._open(url, token, extra)
        try:
            yield response
        finally:
            response.release()

    async def _open(
        self, url: Url, token: str | None, extra: Mapping[str, str] | None = None
    ) -> http.Response:
        """:meth:`_get` without the context manager: the caller releases the response."""
        if self._settings.offline:
            raise SourceUnavailable(f"GET {url.host}{url.path}: HF_HUB_OFFLINE is set")
        for _ in range(MAX_REDIRECTS + 1):
            headers = {**self._headers(url, token), **(extra or {})}
            try:
                response = await self._http.get(url, headers, self._proxy(url))
            except (http.HttpError, OSError) as e:
                raise SourceUnavailable(f"GET {url.host}{url.path}: {e or type(e).__name__}") from e
            if response.status in (301, 302, 303, 307, 308) and "location" in response.headers:
                try:
                    await response.discard()  # so the connection serves the next request
                finally:
                    response.release()
                try:
                    location = url.join(response.headers["location"])
                except ValueError as e:
                    raise SourceUnavailable(f"GET {url.host}{url.path}: redirect to {e}") from e
                if url.scheme == "https" and location.scheme != "https":
                    token = None  # never downgrade a credential to plain http
                url = location
                continue
            return response
        raise SourceUnavailable(f"GET {url.host}{url.path}: more than {MAX_REDIRECTS} redirects")

    async def commit(self, repository: str, revision: str, *, token: str | None) -> str:
        """The 40-hex commit ``revision`` names (annotated tags peeled by the Hub)."""
        url = Url(
            f"{self._base}/api/models/{quote(repository, safe='/')}"
            f"/revision/{quote(revision, safe='')}"
        )
        body = await self._read_json(url, token, f"revision {revision!r} of {repository}")
        try:
            sha = _REVISION.decode(body).sha
        except msgspec.DecodeError as e:
            raise SourceUnavailable(f"revision {revision!r} of {repository}: {e}") from e
        if len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
            raise SourceUnavailable(f"revision {revision!r} of {repository}: bad commit {sha!r}")
        return sha

    async def tree(self, repository: str, commit: str, *, token: str | None) -> list[Entry]:
        """Every file at ``commit``, following ``Link: rel="next"`` pages on the same origin."""
        url: Url | None = Url(
            f"{self._base}/api/models/{quote(repository, safe='/')}/tree/{quote(commit, safe='')}"
            "?recursive=true&expand=false"
        )
        entries: list[Entry] = []
        fetched: set[str] = set()
        while url is not None:
            _check_page(url, fetched, f"tree of {repository}@{commit[:12]}")
            async with self._get(url, token) as response:
                body = await self._body(response, f"tree of {repository}@{commit[:12]}")
                next_url = response.link("next")
            try:
                raws = _TREE.decode(body)
            except msgspec.DecodeError as e:
                raise SourceUnavailable(f"tree of {repository}: malformed page: {e}") from e
            entries.extend(e for e in map(_entry, raws) if e is not None)
            if len(entries) > MAX_TREE_ENTRIES:
                raise SourceUnavailable(f"tree of {repository}: over {MAX_TREE_ENTRIES} files")
            url = self._next_page(next_url, url)
        return entries

    def _next_page(self, link: object, current: Url) -> Url | None:
        if link is None:
            return None
        try:
            nxt = current.join(str(link))
        except ValueError as e:
            raise SourceUnavailable(f"tree page link: {e}") from e
        if nxt.origin != self._origin:
            raise SourceUnavailable(f"tree page link leaves {self._origin}: {nxt.origin}")
        return nxt

    async def _read_json(self, url: Url, token: str | None, what: str) -> bytes:
        async with self._get(url, token) as response:
            return await self._body(response, what)

    async def _body(self, response: http.Response, what: str) -> bytes:
        if response.status != 200:
            raise _failure(response.status, response.headers, what)
        if (response.content_length or 0) > MAX_PAGE_BYTES:
            raise SourceUnavailable(f"{what}: body over {MAX_PAGE_BYTES} bytes")
        try:
            return await response.read(MAX_PAGE_BYTES)
        except (http.HttpError, OSError) as e:
            raise SourceUnavailable(f"{what}: {e or type(e).__name__}") from e

    def file_url(self, repository: str, commit: str, path: str) -> Url:
        """Where ``path``'s bytes at ``commit`` are fetched from (a hub of another kind, such
        as :class:`hub.modelscope.ModelScopeClient`, names them its own way)."""
        return self._url(
            f"/{quote(repository, safe='/')}/resolve/{quote(commit, safe='')}"
            f"/{quote(path, safe='/')}"
        )

    @asynccontextmanager
    async def download(
        self,
        repository: str,
        commit: str,
        path: str,
        *,
        token: str | None,
        start: int = 0,
        end: int | None = None,
    ) -> AsyncIterator[Body]:
        """Open ``path`` at ``commit`` from byte ``start`` up to ``end`` (exclusive).

        A server that ignores ``Range`` answers 200 with the whole file: ``Body.start`` is then 0
        and the caller must restart the file. :raises HubError: on a refusal.
        """
        url = self.file_url(repository, commit, path)
        async with self._get(url, token, range_header(start, end)) as response:
            yield _body_of(response, path)

    async def whole(
        self, repository: str, commit: str, path: str, *, token: str | None, size: int
    ) -> list[bytes | memoryview]:
        """All of a small file's ``size`` bytes from one plain GET, as the network's pieces
        (never joined): :meth:`download` without a context manager or a generator per piece,
        the path a pull of thousands of small files takes for each.

        :raises IntegrityMismatch: the server gives the file another size.
        :raises SourceUnavailable: cut, stalled or short (the caller asks again).
        :raises HubError: a refusal.
        """
        url = self.file_url(repository, commit, path)
        response = await self._open(url, token)
        try:
            body = _body_of(response, path)
            if body.total is not None and body.total != size:
                raise IntegrityMismatch(
                    f"{path}: the server says {body.total} bytes, the manifest {size}"
                )
            pieces = await response.gather(size)
        except (http.HttpError, OSError) as e:
            raise SourceUnavailable(f"download interrupted: {e or type(e).__name__}") from e
        finally:
            response.release()
        got = sum(len(p) for p in pieces)
        if got < size:
            raise SourceUnavailable(f"{path}: the response ended at byte {got} of {size}")
        return pieces


def range_header(start: int, end: int | None) -> dict[str, str] | None:
    """The ``Range`` header asking for bytes ``start`` up to ``end`` (exclusive; None: to the
    file's end); None when that is the whole file (a plain GET)."""
    if start == 0 and end is None:
        return None
    return {"Range": f"bytes={start}-{'' if end is None else end - 1}"}


def _body_of(response: http.Response, path: str) -> Body:
    if response.status == 206:
        start, total = _content_range(response.headers.get("content-range", ""), path)
        return Body(start, total, response)
    if response.status == 200:
        return Body(0, response.content_length, response)
    if response.status == 416:
        raise IntegrityMismatch(f"{path}: the server says the range is past the end of the file")
    raise _failure(response.status, response.headers, path)


def file_body(response: http.Response, path: str) -> Body:
    """A file response as a :class:`Body` (206 with its range, 200 whole), or the refusal
    raised as the Hub's would be: for other servers of files by path (a peer model agent)."""
    return _body_of(response, path)


def _content_range(value: str, path: str) -> tuple[int, int | None]:
    """``bytes a-b/total`` -> (a, total). :raises SourceUnavailable: when malformed."""
    try:
        unit, _, rest = value.partition(" ")
        span, _, total = rest.partition("/")
        first = int(span.partition("-")[0])
        if unit != "bytes":
            raise ValueError(unit)
        return first, None if total == "*" else int(total)
    except ValueError as e:
        raise SourceUnavailable(f"{path}: malformed Content-Range {value!r}") from e


@asynccontextmanager
async def client(
    settings: HubSettings, *, kind: type[HubClient] = HubClient
) -> AsyncIterator[HubClient]:
    """A :class:`HubClient` (or ``kind``, such as :class:`hub.modelscope.ModelScopeClient`)
    whose connections close on exit."""
    transport = http.Client(
        connect_s=settings.connect_timeout_s,
        stall_s=settings.stall_timeout_s,
        max_connections=settings.max_connections,
        ca_file=settings.ca_file,
    )
    try:
        yield kind(transport, settings)
    finally:
        # Even when cancelled: the wait is bounded (http.CLOSE_TIMEOUT_S), then it aborts.
        closing = asyncio.ensure_future(transport.aclose())
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            await closing
            raise

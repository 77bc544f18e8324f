"""ModelScope behind the Hub client's interface: commit, file listing, file bytes, token check.

:class:`ModelScopeClient` is a :class:`hub.client.HubClient` (same session, redirects, proxies,
token-to-own-origin rule, errors), so the materializer, the downloader and the manifest code
treat it as any hub: only where a commit, a listing and a file are found differs. Its listing is
turned into the same :class:`~hub.manifest.Manifest`, so the text and digest rules are the
Hugging Face ones; every ModelScope entry carries its ``Sha256``, so every line is ``sha256:``
and every downloaded byte is verified against it.

The API, as ModelScope's own SDK (``modelscope/hub/api.py``) and its users call it:

- commit: ``GET /api/v1/models/<id>/commits?Ref=<rev>&PageNumber=1&PageSize=1``, the answer
  ``{"Code": 200, "Success": true, "Data": {"Commit": [{"Id": <40 hex>, ...}], ...}}``; a branch
  or tag is cross-checked with the repository's git refs (``/<id>.git/info/refs``, the request
  ``git ls-remote`` makes, user ``oauth2`` and the token as password), so a commit the API and
  git disagree on is never pinned;
- files: ``GET /api/v1/models/<id>/repo/files?Revision=<commit>&Recursive=true``, the answer's
  ``Data.Files[]`` with ``Path``, ``Type`` (``blob``/``tree``), ``Size``, ``Sha256``. The API has
  no paging and cuts a listing at :data:`LISTING_CAP` entries, so a listing that holds that many
  is re-listed per directory (``Root=<dir>``); a directory with that many direct entries cannot
  be listed completely and is refused (SourceUnavailable), never pinned truncated;
- file bytes: ``GET /api/v1/models/<id>/repo?Revision=<commit>&FilePath=<path>`` (``Range``
  honoured as by any hub);
- token check: ``GET /openapi/v1/users/me`` (401: the token is not valid).

Credentials go only to the endpoint's origin: ``Authorization: Bearer`` (the OpenAPI's
convention) and the ``m_session_id`` cookie the SDK sends to ``/api/v1``.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import quote, urlencode

import msgspec

from hub import http
from hub.client import USER_AGENT, HubClient
from hub.errors import (
    AccessDenied,
    HubError,
    InvalidManifest,
    RevisionNotFound,
    SourceUnavailable,
)
from hub.manifest import Entry
from hub.urls import Url

__all__ = ["LISTING_CAP", "ModelScopeClient", "User", "parse_refs"]

LISTING_CAP: Final = 3000
"""Entries one ``repo/files`` answer holds at most: an answer this long may be cut."""
MAX_LISTINGS: Final = 2000
"""``repo/files`` requests one listing may make (directories re-listed): a hostile server's
tree must end."""
SPURIOUS_DENIALS: Final = 3
"""Times a 403 on a directory listing is asked again once the walk has read the repository."""
DENIAL_RETRY_S: Final = 0.2
MAX_ENTRIES: Final = 100_000
MAX_BODY: Final = 16 * 1024 * 1024
_HEX40: Final = re.compile(r"[0-9a-f]{40}")


class _Pascal(msgspec.Struct, frozen=True, rename="pascal", forbid_unknown_fields=False):
    pass


class _Commit(_Pascal, frozen=True):
    id: str = ""


class _CommitPage(_Pascal, frozen=True):
    commit: list[_Commit] | None = None


class _CommitAnswer(_Pascal, frozen=True):
    code: int | str = 200
    success: bool = True
    message: str = ""
    data: _CommitPage | None = None


class _File(_Pascal, frozen=True):
    path: str = ""
    type: str = "blob"
    size: int = 0
    sha256: str | None = None


class _Files(_Pascal, frozen=True):
    files: list[_File] | None = None


class _FilesAnswer(_Pascal, frozen=True):
    code: int | str = 200
    success: bool = True
    message: str = ""
    data: _Files | None = None


class User(msgspec.Struct, frozen=True):
    """Who a token belongs to (``/openapi/v1/users/me``)."""

    username: str = ""


class _UserAnswer(msgspec.Struct, frozen=True):
    success: bool = True
    data: User | None = None
    message: str = ""


def _failure(status: int, what: str, body: bytes = b"") -> HubError:
    """An HTTP refusal as a reason: 401, 403 and 404 are the token's business (AccessDenied),
    everything else (5xx, 429) is the hub's (SourceUnavailable)."""
    detail = body[:200].decode("utf-8", "replace").strip() or f"HTTP {status}"
    message = f"{what}: HTTP {status}: {detail}"
    if status in (401, 403, 404):
        return AccessDenied(message)
    return SourceUnavailable(message)


def _refused(answer: _CommitAnswer | _FilesAnswer, what: str) -> None:
    """An envelope that says the call failed although the HTTP status was 200."""
    if not answer.success or str(answer.code) != "200":
        raise SourceUnavailable(f"{what}: ModelScope answered code {answer.code}: {answer.message}")


def parse_refs(body: bytes) -> dict[str, str]:
    """Ref name -> commit from a smart-HTTP ``info/refs`` advertisement (``git ls-remote``'s).

    Peeled tags (``refs/tags/v1^{}``) are kept under that name. :raises SourceUnavailable: the
    pkt-lines are malformed.
    """
    refs: dict[str, str] = {}
    at = 0
    while at + 4 <= len(body):
        try:
            size = int(body[at : at + 4], 16)
        except ValueError as e:
            raise SourceUnavailable(f"git refs: malformed pkt-line at byte {at}") from e
        if size == 0:
            at += 4
            continue
        if size < 4 or at + size > len(body):
            raise SourceUnavailable(f"git refs: malformed pkt-line at byte {at}")
        line = body[at + 4 : at + size].split(b"\0", 1)[0].rstrip(b"\n").decode("utf-8", "replace")
        at += size
        sha, _, name = line.partition(" ")
        if _HEX40.fullmatch(sha) and name:
            refs[name] = sha
    return refs


def _ref_commit(refs: Mapping[str, str], revision: str) -> str | None:
    """The commit git names for a branch or tag ``revision`` (a tag peeled), else None."""
    for name in (f"refs/heads/{revision}", f"refs/tags/{revision}^{{}}", f"refs/tags/{revision}"):
        if name in refs:
            return refs[name]
    return None


class ModelScopeClient(HubClient):
    """ModelScope calls on one shared session; create with :func:`hub.client.client` settings
    and :func:`modelscope_client`."""

    listing_cap: int = LISTING_CAP
    """Where an answer counts as cut (the API's :data:`LISTING_CAP`; a test lowers it)."""

    def _headers(self, url: Url, token: str | None) -> dict[str, str]:
        headers = super()._headers(url, token)
        if token and url.origin == self._endpoint.origin:
            headers["Cookie"] = f"m_session_id={token}"
        return headers

    def _api(self, path: str, query: Mapping[str, str]) -> Url:
        return Url(f"{self._base}{path}?{urlencode(query)}")

    async def _json(self, url: Url, token: str | None, what: str) -> bytes:
        async with self._get(url, token) as response:
            if response.status != 200:
                body = b""
                if (response.content_length or 0) <= 4096:
                    try:
                        body = await response.read(4096)
                    except (http.HttpError, OSError):
                        body = b""
                raise _failure(response.status, what, body)
            if (response.content_length or 0) > MAX_BODY:
                raise SourceUnavailable(f"{what}: body over {MAX_BODY} bytes")
            try:
                return await response.read(MAX_BODY)
            except (http.HttpError, OSError) as e:
                raise SourceUnavailable(f"{what}: {e or type(e).__name__}") from e

    def file_url(self, repository: str, commit: str, path: str) -> Url:
        return self._api(
            f"/api/v1/models/{quote(repository, safe='/')}/repo",
            {"Revision": commit, "FilePath": path},
        )

    async def commit(self, repository: str, revision: str, *, token: str | None) -> str:
        """The 40-hex commit ``revision`` names, agreed on by the API and the git refs.

        A refusal with a token says whether ModelScope refuses the token itself (the token
        check), so a person knows to replace the token rather than ask for access.
        """
        try:
            return await self._commit(repository, revision, token=token)
        except AccessDenied as e:
            if token:
                try:
                    await self.user(token)
                except AccessDenied as check:
                    raise AccessDenied(f"{e}; the token itself is refused: {check}") from e
                except HubError:
                    pass  # the check could not say: the refusal stands as it is
            raise

    async def _commit(self, repository: str, revision: str, *, token: str | None) -> str:
        what = f"revision {revision!r} of {repository}"
        url = self._api(
            f"/api/v1/models/{quote(repository, safe='/')}/commits",
            {"Ref": revision, "PageNumber": "1", "PageSize": "1"},
        )
        body = await self._json(url, token, what)
        try:
            answer = msgspec.json.decode(body, type=_CommitAnswer)
        except msgspec.DecodeError as e:
            raise SourceUnavailable(f"{what}: malformed answer: {e}") from e
        _refused(answer, what)
        commits = (answer.data.commit if answer.data else None) or []
        if not commits:
            raise RevisionNotFound(f"{what}: ModelScope lists no commit for it")
        sha = commits[0].id.lower()
        if not _HEX40.fullmatch(sha):
            raise SourceUnavailable(f"{what}: bad commit id {commits[0].id[:80]!r}")
        if _HEX40.fullmatch(revision.lower()):
            if sha != revision.lower():
                raise SourceUnavailable(f"{what}: ModelScope answered another commit {sha}")
            return sha
        git = _ref_commit(await self._refs(repository, token), revision)
        if git != sha:
            raise SourceUnavailable(
                f"{what}: the API says {sha} but the git refs say {git or 'no such ref'}"
            )
        return sha

    async def _refs(self, repository: str, token: str | None) -> dict[str, str]:
        """The repository's git refs; one request, no redirect (the credential is Basic)."""
        url = self._api(
            f"/{quote(repository, safe='/')}.git/info/refs", {"service": "git-upload-pack"}
        )
        what = f"git refs of {repository}"
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if token:
            pair = base64.b64encode(f"oauth2:{token}".encode()).decode()
            headers["Authorization"] = f"Basic {pair}"
        if self._settings.offline:
            raise SourceUnavailable(f"{what}: offline")
        try:
            response = await self._http.get(url, headers, self._proxy(url))
        except (http.HttpError, OSError) as e:
            raise SourceUnavailable(f"{what}: {e or type(e).__name__}") from e
        try:
            if response.status != 200:
                raise _failure(response.status, what)
            return parse_refs(await response.read(MAX_BODY))
        except (http.HttpError, OSError) as e:
            raise SourceUnavailable(f"{what}: {e or type(e).__name__}") from e
        finally:
            response.release()

    async def tree(self, repository: str, commit: str, *, token: str | None) -> list[Entry]:
        """Every file at ``commit``; directories re-listed where an answer may be cut."""
        walk = _Walk(self, repository, commit, token)
        await walk.directory(None)
        return walk.entries

    async def files(
        self, repository: str, commit: str, root: str | None, *, recursive: bool, token: str | None
    ) -> list[_File]:
        """One ``repo/files`` answer (under ``root``, recursive or direct children only)."""
        query = {"Revision": commit, "Recursive": "true" if recursive else "false"}
        if root is not None:
            query["Root"] = root
        what = f"files of {repository}@{commit[:12]}" + (f" under {root}" if root else "")
        url = self._api(f"/api/v1/models/{quote(repository, safe='/')}/repo/files", query)
        body = await self._json(url, token, what)
        try:
            answer = msgspec.json.decode(body, type=_FilesAnswer)
        except msgspec.DecodeError as e:
            raise SourceUnavailable(f"{what}: malformed answer: {e}") from e
        _refused(answer, what)
        return list((answer.data.files if answer.data else None) or [])

    async def user(self, token: str) -> User:
        """Whom ``token`` belongs to. :raises AccessDenied: ModelScope refuses the token."""
        url = Url(f"{self._base}/openapi/v1/users/me")
        body = await self._json(url, token, "the token check (/openapi/v1/users/me)")
        try:
            answer = msgspec.json.decode(body, type=_UserAnswer)
        except msgspec.DecodeError as e:
            raise SourceUnavailable(f"the token check: malformed answer: {e}") from e
        if not answer.success or answer.data is None:
            raise AccessDenied(f"the token check: {answer.message or 'refused'}")
        return answer.data


class _Walk:
    """One listing: the files found so far and the requests it may still make."""

    def __init__(self, client: ModelScopeClient, repository: str, commit: str, token: str | None):
        self.client, self.repository, self.commit, self.token = client, repository, commit, token
        self.entries: list[Entry] = []
        self.requests = 0
        self.listed = False
        """Some listing of this walk succeeded: the credential is proven."""

    async def _files(self, root: str | None, *, recursive: bool) -> list[_File]:
        """One listing; a 403 after an earlier listing of this walk succeeded is asked again
        (at most :data:`SPURIOUS_DENIALS` times): ModelScope's SDK documents that the server
        now and then denies a tree request on a repository just read, and a walk of hundreds
        of requests would otherwise fail on one of them. A first refusal is taken as it is."""
        for attempt in range(SPURIOUS_DENIALS + 1):
            self.requests += 1
            if self.requests > MAX_LISTINGS:
                raise SourceUnavailable(f"files of {self.repository}: over {MAX_LISTINGS} listings")
            try:
                answer = await self.client.files(
                    self.repository, self.commit, root, recursive=recursive, token=self.token
                )
            except AccessDenied:
                if not self.listed or attempt == SPURIOUS_DENIALS:
                    raise
                await asyncio.sleep(DENIAL_RETRY_S * (attempt + 1))
                continue
            self.listed = True
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _add(self, raw: _File, root: str | None) -> None:
        _inside(raw.path, root)
        if raw.type == "tree":
            return
        # No de-duplication: a cut answer is dropped whole, so a path named twice is the
        # server's error, and :meth:`Manifest.of` refuses it (InvalidManifest).
        self.entries.append(_entry(raw))
        if len(self.entries) > MAX_ENTRIES:
            raise SourceUnavailable(f"files of {self.repository}: over {MAX_ENTRIES} files")

    async def directory(self, root: str | None) -> None:
        """List ``root`` (None: the repository) completely, or raise."""
        answer = await self._files(root, recursive=True)
        cap = self.client.listing_cap
        if len(answer) < cap:
            for raw in answer:
                self._add(raw, root)
            return
        children = await self._files(root, recursive=False)
        if len(children) >= cap:
            where = root or "the repository root"
            raise SourceUnavailable(
                f"files of {self.repository}: {where} has {cap} or more direct entries, "
                "more than ModelScope lists at once"
            )
        for raw in children:
            _inside(raw.path, root)
            if raw.type == "tree":
                await self.directory(raw.path)
            else:
                self._add(raw, root)


def _inside(path: str, root: str | None) -> None:
    """A listing under ``root`` names only paths below it (else a server could loop us)."""
    if root is not None and not path.startswith(root + "/"):
        raise SourceUnavailable(f"the listing of {root} names {path[:200]!r}, outside it")


def _entry(raw: _File) -> Entry:
    if not raw.sha256:
        raise InvalidManifest(f"{raw.path}: the listing carries no Sha256")
    return Entry("sha256", raw.sha256.lower(), raw.size, raw.path)

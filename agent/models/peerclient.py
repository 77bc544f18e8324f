"""The reading side of peer delivery: a peer model agent's published tree, as the Hub's files.

:class:`PeerClient` asks a peer (found in :mod:`agent.models.peering`) for a digest's stored
manifest and binds it to the digest before anything else: the text is parsed back, re-encoded
canonically and hashed, and a manifest that is not exactly ``sha256:<hex>`` is refused as
:class:`IntegrityMismatch`. :class:`PeerFiles` then serves that manifest's files through the
same interface as :class:`hub.client.HubClient` (:class:`agent.models.downloading.Files`), so
every byte is verified by the very code that verifies the Hub's (per-file SHA-256 or git blob
SHA-1, and the size). A peer is trusted for nothing but being there.

Every request is signed with this node's peer key (:func:`bus.peers.authorization`); a peer
that refuses it as from an unknown node (it has not, or not yet, heard our offer) is asked once
more after our offer went out again (:meth:`PeerClient.open`). Its
errors are the Hub's (:mod:`hub.errors`): refused (401/403/404) is :class:`AccessDenied`,
anything else :class:`SourceUnavailable`, which the materializer answers by trying the next
peer or the Hub.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

import anyio

from agent.models.peering import Directory
from bus import jwt
from bus import peers as contract
from hub import client as hub_client
from hub import http
from hub.errors import AccessDenied, HubError, IntegrityMismatch, InvalidManifest, SourceUnavailable
from hub.manifest import Manifest, parse
from hub.urls import Url

__all__ = ["PeerClient", "PeerFiles", "PeerPull", "pull"]

_ANNOUNCE_S: Final = 5.0
"""How long a download refused as unknown waits for its node's offer to go out again."""
MAX_MANIFEST_BYTES: Final = 16 * 1024 * 1024
"""A manifest of 100,000 files of long paths stays well under this."""


def _refusal(status: int, what: str) -> HubError:
    if status in (401, 403, 404):
        return AccessDenied(f"{what}: the peer answers HTTP {status}")
    return SourceUnavailable(f"{what}: the peer answers HTTP {status}")


class PeerClient:
    """Signed GETs to peers on one keep-alive :class:`hub.http.Client` (the caller's)."""

    def __init__(
        self,
        transport: http.Client,
        *,
        node: str,
        key: jwt.NKey,
        clock: Callable[[], float] = time.time,
        announce: Callable[[float], Awaitable[bool]] | None = None,
    ) -> None:
        self._http = transport
        self.node = node
        self.key = key
        self._clock = clock
        self._announce = announce
        """Send our offer again, waiting up to the given seconds until it went out
        (:meth:`agent.models.peering.Directory.announce`); None: never retried."""

    def _url(self, offer: contract.PeerOffer, path: str) -> Url:
        try:
            return Url(offer.url.rstrip("/") + path)
        except ValueError as e:
            raise SourceUnavailable(f"peer {offer.node}: unusable URL: {e}") from e

    async def open(
        self, offer: contract.PeerOffer, path: str, extra: dict[str, str] | None = None
    ) -> http.Response:
        """GET ``path`` (already percent-encoded) from ``offer``'s node, signed for it; the
        caller releases the response. :raises SourceUnavailable: no answer.

        A 401 that says the peer does not know us (``unknown-node``: it missed our offer, or
        it is still on its way) is answered once: our offer is sent again, then the request
        (the peer waits a moment for an offer it lacks, so the retry finds it there).
        """
        response = await self._get(offer, path, extra)
        if (
            response.status != 401
            or self._announce is None
            or not contract.is_unknown_node(response.headers.get("www-authenticate"))
        ):
            return response
        response.release()
        await self._announce(_ANNOUNCE_S)  # not sent in time: the retry is refused as before
        return await self._get(offer, path, extra)

    async def _get(
        self, offer: contract.PeerOffer, path: str, extra: dict[str, str] | None
    ) -> http.Response:
        url = self._url(offer, path)
        signed = contract.authorization(
            self.key, offer.node, self.node, int(self._clock()), url.target
        )
        headers = {
            "User-Agent": hub_client.USER_AGENT,
            "Accept-Encoding": "identity",
            "Authorization": signed,
            **(extra or {}),
        }
        try:
            return await self._http.get(url, headers)
        except (http.HttpError, OSError) as e:
            raise SourceUnavailable(f"peer {offer.node}: {e or type(e).__name__}") from e

    async def manifest(self, offer: contract.PeerOffer, hex_: str) -> Manifest:
        """``offer``'s stored manifest of ``hex_``, bound to the digest.

        :raises IntegrityMismatch: the text is not canonical or hashes to another digest.
        :raises AccessDenied: the peer refuses us or does not hold it (any more).
        :raises SourceUnavailable: unreachable, cut, or too large.
        """
        what = f"manifest of sha256:{hex_[:12]} from peer {offer.node}"
        response = await self.open(offer, f"/peer/v1/trees/{hex_}")
        try:
            if response.status != 200:
                raise _refusal(response.status, what)
            body = await response.read(MAX_MANIFEST_BYTES)
        except (http.HttpError, OSError) as e:
            raise SourceUnavailable(f"{what}: {e or type(e).__name__}") from e
        finally:
            response.release()
        try:
            manifest = parse(body.decode("utf-8"))
        except (UnicodeDecodeError, InvalidManifest) as e:
            raise IntegrityMismatch(f"{what}: not a canonical manifest: {e}") from e
        if manifest.digest != "sha256:" + hex_:
            raise IntegrityMismatch(f"{what}: it hashes to {manifest.digest}")
        return manifest

    def files(self, offer: contract.PeerOffer, hex_: str) -> PeerFiles:
        return PeerFiles(self, offer, hex_)


@dataclass(frozen=True)
class PeerFiles:
    """One peer's published tree of one digest, as :class:`agent.models.downloading.Files`.

    ``repository``, ``commit`` and ``token`` of the interface are ignored: a peer serves by
    digest and path, and no Hub credential ever leaves the node.
    """

    client: PeerClient
    offer: contract.PeerOffer
    hex: str

    def _path(self, path: str) -> str:
        return f"/peer/v1/trees/{self.hex}/files/{quote(path, safe='/')}"

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
    ) -> AsyncIterator[hub_client.Body]:
        """``path``'s bytes from ``start`` to ``end`` (exclusive), as the Hub's would be."""
        del repository, commit, token
        extra = hub_client.range_header(start, end)
        response = await self.client.open(self.offer, self._path(path), extra)
        try:
            if response.status not in (200, 206):
                raise _refusal(response.status, f"{path} from peer {self.offer.node}")
            yield hub_client.file_body(response, path)
        finally:
            response.release()

    async def whole(
        self, repository: str, commit: str, path: str, *, token: str | None, size: int
    ) -> list[bytes | memoryview]:
        """All ``size`` bytes of a small file, as the network's pieces.

        :raises IntegrityMismatch: the peer gives it another size.
        :raises SourceUnavailable: cut or short.
        """
        del repository, commit, token
        what = f"{path} from peer {self.offer.node}"
        response = await self.client.open(self.offer, self._path(path))
        try:
            if response.status != 200:
                raise _refusal(response.status, what)
            if response.content_length != size:
                raise IntegrityMismatch(f"{what}: {response.content_length} bytes, not {size}")
            pieces = await response.gather(size)
        except (http.HttpError, OSError) as e:
            raise SourceUnavailable(f"{what}: {e or type(e).__name__}") from e
        finally:
            response.release()
        if sum(len(p) for p in pieces) < size:
            raise SourceUnavailable(f"{what}: the response ended short of {size} bytes")
        return pieces


@dataclass(frozen=True)
class PeerPull:
    """What the materializer needs of peers: who holds a digest, its manifest, its files."""

    directory: Directory
    client: PeerClient
    enabled: Callable[[], bool] = lambda: True
    """The NodeModelStore spec's ``download.peerSync``, read at each download: off, no peer is
    asked (this node still serves its own trees)."""

    def holders(self, hex_: str) -> list[contract.PeerOffer]:
        return self.directory.holders(hex_) if self.enabled() else []

    async def manifest(self, offer: contract.PeerOffer, hex_: str) -> Manifest:
        return await self.client.manifest(offer, hex_)

    def files(self, offer: contract.PeerOffer, hex_: str) -> PeerFiles:
        return self.client.files(offer, hex_)


@asynccontextmanager
async def pull(
    directory: Directory,
    *,
    node: str,
    key: jwt.NKey,
    enabled: Callable[[], bool] = lambda: True,
    connect_s: float = 10.0,
    stall_s: float = 30.0,
    max_connections: int = 64,
) -> AsyncIterator[PeerPull]:
    """A :class:`PeerPull` on an HTTP client of its own (the Hub's proxies never apply to a
    peer), whose connections close on exit, within :data:`hub.http.CLOSE_TIMEOUT_S`."""
    transport = http.Client(connect_s=connect_s, stall_s=stall_s, max_connections=max_connections)
    try:
        client = PeerClient(transport, node=node, key=key, announce=directory.announce)
        yield PeerPull(directory, client, enabled)
    finally:
        with anyio.CancelScope(shield=True):
            await transport.aclose()

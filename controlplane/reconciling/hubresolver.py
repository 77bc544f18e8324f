"""The seam between ModelArtifact reconciling and the Hub: :class:`Resolver` and its adapter.

Reconcilers depend on the :class:`Resolver` Protocol only; :class:`HubResolver` implements it
with :mod:`hub` (the same manifest code the node plugin verifies downloads with, so both
sides compute one digest) and maps every Hub error to :class:`controlplane.errors.ResolveFailed`
carrying the status reason and whether retrying soon can help.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Literal, Protocol

import msgspec

import hub
from controlplane import errors
from hub import client as hub_client
from hub import errors as hub_errors
from hub.modelscope import ModelScopeClient

__all__ = [
    "HubResolver",
    "ModelScopeResolver",
    "Resolved",
    "Resolver",
    "hub_resolver",
    "modelscope_resolver",
]


class Resolved(msgspec.Struct, frozen=True, kw_only=True):
    """A repository pinned at a commit: what ``status.resolved`` holds."""

    commit: str
    digest: str
    file_count: int
    size_bytes: int
    digest_source: Literal["Hub", "Expected"] = "Hub"
    """``Expected``: the Hub could not be reached and the artifact was pinned to its
    ``expectedDigest`` instead (no commit, no sizes: the nodes fetch it from peers only)."""

    @classmethod
    def anchored(cls, expected: str) -> Resolved:
        """The pin of an artifact whose Hub stayed unreachable: its ``expectedDigest``."""
        return cls(commit="", digest=expected, file_count=0, size_bytes=0, digest_source="Expected")


class Resolver(Protocol):
    async def resolve(
        self,
        repository: str,
        revision: str,
        *,
        token: str | None,
        allow: Sequence[str],
        ignore: Sequence[str],
    ) -> Resolved:
        """Pin ``revision`` of ``repository`` and list its (filtered) files.

        :raises ResolveFailed: with ``reason`` the condition reason; ``temporary`` when a
            later attempt may succeed without anyone changing anything.
        """
        ...

    async def revalidate(
        self,
        repository: str,
        commit: str,
        digest: str,
        *,
        token: str | None,
        allow: Sequence[str],
        ignore: Sequence[str],
    ) -> None:
        """Check that ``commit`` still lists ``digest`` and that its files can still be read
        with ``token`` (a gated repository, a revoked token, a deleted repository refuse).

        :raises ResolveFailed: as :meth:`resolve`; ``DigestMismatch`` when the commit now
            lists other files.
        """
        ...


_TEMPORARY: tuple[type[hub_errors.HubError], ...] = (hub_errors.SourceUnavailable,)


class HubResolver:
    """:class:`Resolver` over one Hub session (:func:`hub_resolver` opens and closes it)."""

    def __init__(self, client: hub_client.HubClient) -> None:
        self._client = client

    async def resolve(
        self,
        repository: str,
        revision: str,
        *,
        token: str | None,
        allow: Sequence[str],
        ignore: Sequence[str],
    ) -> Resolved:
        try:
            manifest = await hub.resolve(
                repository, revision, token=token, allow=allow, ignore=ignore, hub=self._client
            )
        except hub_errors.HubError as e:
            temporary = isinstance(e, _TEMPORARY)
            raise errors.ResolveFailed(e.reason, str(e), temporary=temporary) from e
        return Resolved(
            commit=manifest.commit or "",
            digest=manifest.digest,
            file_count=len(manifest.entries),
            size_bytes=manifest.size,
        )

    async def revalidate(
        self,
        repository: str,
        commit: str,
        digest: str,
        *,
        token: str | None,
        allow: Sequence[str],
        ignore: Sequence[str],
    ) -> None:
        """The listing at ``commit`` again, then the first byte of the first non-empty file:
        the listing alone would pass a gated repository whose files are refused."""
        try:
            manifest = await hub.resolve(
                repository, commit, token=token, allow=allow, ignore=ignore, hub=self._client
            )
            if manifest.digest != digest:
                raise errors.ResolveFailed(
                    "DigestMismatch",
                    f"{repository}@{commit[:12]} now lists {manifest.digest}, not {digest}",
                )
            first = next((e for e in manifest.entries if e.size > 0), None)
            if first is not None:
                async with self._client.download(
                    repository, commit, first.path, token=token, start=0, end=1
                ) as body:
                    async for _ in body.pieces():
                        pass
        except hub_errors.HubError as e:
            temporary = isinstance(e, _TEMPORARY)
            raise errors.ResolveFailed(e.reason, str(e), temporary=temporary) from e


@asynccontextmanager
async def hub_resolver(endpoint: str) -> AsyncIterator[HubResolver]:
    """A :class:`HubResolver` for ``endpoint``; its connections close on exit."""
    async with hub_client.client(hub_client.HubSettings(endpoint=endpoint)) as client:
        yield HubResolver(client)


class ModelScopeResolver:
    """:class:`Resolver` for ``source.modelScope``, against the endpoint the setting
    ``model-artifact-modelscope-endpoint`` names *now* (``endpoint`` is read at each resolve,
    so a changed setting applies to the next artifact without a restart). One session per
    endpoint used (a handful over a process's life: one per value the setting took), all
    closed when the worker stops."""

    def __init__(self, endpoint: Callable[[], str], stack: AsyncExitStack) -> None:
        self._endpoint = endpoint
        self._stack = stack
        self._clients: dict[str, hub_client.HubClient] = {}

    async def _client(self, endpoint: str) -> hub_client.HubClient:
        client = self._clients.get(endpoint)
        if client is None:
            settings = hub_client.HubSettings(endpoint=endpoint)
            client = await self._stack.enter_async_context(
                hub_client.client(settings, kind=ModelScopeClient)
            )
            self._clients[endpoint] = client
        return client

    async def resolve(
        self,
        repository: str,
        revision: str,
        *,
        token: str | None,
        allow: Sequence[str],
        ignore: Sequence[str],
    ) -> Resolved:
        try:
            client = await self._client(self._endpoint())
        except hub_errors.HubError as e:
            raise errors.ResolveFailed(e.reason, str(e), temporary=True) from e
        resolver = HubResolver(client)
        return await resolver.resolve(repository, revision, token=token, allow=allow, ignore=ignore)

    async def revalidate(
        self,
        repository: str,
        commit: str,
        digest: str,
        *,
        token: str | None,
        allow: Sequence[str],
        ignore: Sequence[str],
    ) -> None:
        """As :meth:`HubResolver.revalidate`, at the endpoint the setting names now."""
        try:
            client = await self._client(self._endpoint())
        except hub_errors.HubError as e:
            raise errors.ResolveFailed(e.reason, str(e), temporary=True) from e
        await HubResolver(client).revalidate(
            repository, commit, digest, token=token, allow=allow, ignore=ignore
        )


@asynccontextmanager
async def modelscope_resolver(endpoint: Callable[[], str]) -> AsyncIterator[ModelScopeResolver]:
    """A :class:`ModelScopeResolver`; every session it opened closes on exit."""
    async with AsyncExitStack() as stack:
        yield ModelScopeResolver(endpoint, stack)

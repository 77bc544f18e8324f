"""Reaching one subscribed cluster's Kubernetes API: plain REST under a prefix.

In ``gpustack-api`` mode every request goes to the GPUStack server on this host,
``<scheme>://localhost:<port>/v2/clusters/<cluster>/proxy/<path>``, with
``Authorization: Bearer <token>`` (the token the subscription carried); TLS is not verified, as
the reference gateway does not. The server relays the request to a READY worker of the cluster,
which relays it to its kube-apiserver; so every answer, including the server's own refusals
(401, 403, 404, 422, 503 with a ``{"code", "reason", "message"}`` body), comes back as an
:class:`~controlplane.errors.ApiError` of that status for the caller to treat as a state.

In ``loopback`` mode the same two calls go through the process's own Kubernetes client.

Invariant: a response is always released (the session's pool never leaks a connection), and
a watch yields decoded ``{"type", "object"}`` events until the server ends the stream.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import aiohttp
import anyio
import msgspec

from controlplane import errors
from controlplane.gateway.settings import Upstream
from controlplane.k8s.client import KubeClient
from controlplane.resources import Resource

__all__ = ["ClusterApi", "ProxyApi", "open_session"]

log = logging.getLogger(__name__)

Query = Sequence[tuple[str, str]]
USER_AGENT = "gpustack-operator/worker-gateway"
WATCH_SECONDS = 300


class ClusterApi(Protocol):
    async def get(self, path: str, query: Query = ()) -> dict[str, Any]:
        """GET a JSON object; :raises errors.ApiError: any non-2xx answer or transport failure."""
        ...

    def watch(self, path: str, query: Query) -> AsyncIterator[dict[str, Any]]:
        """The ``{"type", "object"}`` events of a watch until the server ends it."""
        ...


def _message(status: int, body: bytes) -> str:
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body[:200].decode(errors="replace").strip() or f"HTTP {status}"
    if isinstance(decoded, dict) and decoded.get("message"):
        return str(decoded["message"])[:300]
    return f"HTTP {status}"


class ProxyApi:
    """One cluster through the GPUStack server's proxy route."""

    def __init__(self, session: aiohttp.ClientSession, base: str, token: str, timeout_s: float):
        self._session = session
        self._base = base.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                         "User-Agent": USER_AGENT}  # fmt: skip
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=10)

    async def get(self, path: str, query: Query = ()) -> dict[str, Any]:
        url = f"{self._base}/{path.lstrip('/')}"
        try:
            async with self._session.get(
                url, params=list(query), headers=self._headers, timeout=self._timeout
            ) as response:
                body = await response.read()
                if response.status >= 300:
                    raise errors.for_status(response.status, _message(response.status, body))
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise errors.ServerError(0, f"GET {path}: {type(e).__name__}: {e}") from e
        try:
            decoded = msgspec.json.decode(body)
        except msgspec.DecodeError as e:
            raise errors.ServerError(0, f"GET {path}: not JSON") from e
        if not isinstance(decoded, dict):
            raise errors.ServerError(0, f"GET {path}: not a JSON object")
        return decoded

    async def watch(self, path: str, query: Query) -> AsyncIterator[dict[str, Any]]:
        url = f"{self._base}/{path.lstrip('/')}"
        # A watch ends at its timeoutSeconds (300); a minute more of silence is a dead link.
        timeout = aiohttp.ClientTimeout(connect=10, sock_read=WATCH_SECONDS + 60)
        try:
            async with self._session.get(
                url, params=list(query), headers=self._headers, timeout=timeout
            ) as response:
                if response.status >= 300:
                    body = await response.read()
                    raise errors.for_status(response.status, _message(response.status, body))
                async for line in response.content:
                    event = _event(line)
                    if event is not None:
                        yield event
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise errors.ServerError(0, f"watch {path}: {type(e).__name__}: {e}") from e


def _event(line: bytes) -> dict[str, Any] | None:
    """One watch line; an ERROR event becomes the error it carries (410: list again)."""
    if not line.strip():
        return None
    try:
        event = msgspec.json.decode(line)
    except msgspec.DecodeError:
        log.debug("watch: dropped a line that is not JSON")
        return None
    if not isinstance(event, dict):
        return None
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise errors.for_status(int(status.get("code") or 500), str(status.get("message") or ""))
    return event


class LoopbackApi:
    """Every cluster is the one the process's own client reaches."""

    def __init__(self, api: KubeClient) -> None:
        self._api = api

    async def get(self, path: str, query: Query = ()) -> dict[str, Any]:
        result = await self._api.request("GET", path, query=list(query))
        if not isinstance(result, dict):
            raise errors.ServerError(0, f"GET {path}: not a JSON object")
        return result

    async def watch(self, path: str, query: Query) -> AsyncIterator[dict[str, Any]]:
        resource = _resource_of(path)
        rv = dict(query).get("resourceVersion")
        async for event in self._api.watch(resource, resource_version=rv):
            yield {"type": event.type, "object": event.object}


def _resource_of(path: str) -> Resource:
    """The resource of a cluster-wide collection path ``/apis/<group>/<version>/<plural>``."""
    _, _, group, version, plural = path.rstrip("/").split("/")[-5:]
    return Resource(group=group, version=version, plural=plural, kind=plural)


@asynccontextmanager
async def open_session(upstream: Upstream) -> AsyncIterator[aiohttp.ClientSession]:
    """One connection pool for every cluster (they share host and port); TLS not verified."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connector = aiohttp.TCPConnector(ssl=context, limit=max(10, upstream.burst))
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            yield session
        finally:
            with anyio.CancelScope(shield=True):
                await session.close()

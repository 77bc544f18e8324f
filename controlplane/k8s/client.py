"""The Kubernetes API adapter: the only module that imports ``kubernetes_asyncio``.

:func:`open_client` yields a :class:`KubeClient` speaking raw REST paths (see
:mod:`controlplane.resources`) with JSON bodies, so one small surface serves CRDs, custom objects,
Nodes and Leases alike. Every request:

- waits for the client-side rate limit (``qps``/``burst``);
- is retried with capped exponential backoff on 429 (honouring ``Retry-After``) and on 5xx or
  connection failures, up to ``max_retries`` times; a 409 is *not* retried here: a conflict means
  the caller's view is stale and only the caller can re-read and re-plan;
- maps failures to :mod:`controlplane.errors` with ``from e``.

:meth:`KubeClient.watch` streams a collection's changes through ``kubernetes_asyncio``'s
``Watch`` over the same raw paths; a watch resumed more than ``relist_s``
(``--informer-cache-resync-period``) after its collection's last full list starts over with one,
so every watcher sees the whole collection again at that period.

:meth:`KubeClient.listing` reads a collection in pages of ``limit`` (500, as client-go's pager)
chained by the server's ``continue`` token and returns the items with the list's
``resourceVersion`` (where a watch of the same collection starts); a continue token the server
no longer serves (410: its resourceVersion was compacted) starts the list over from the first
page, a few times at most.

Writes are merge patches (``application/merge-patch+json``) whose body may carry
``metadata.resourceVersion`` as a precondition, or server-side apply with field manager
``gpustack-operator`` (CRDs).
"""

from __future__ import annotations

import builtins
import itertools
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import aiohttp
import anyio
import msgspec
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.config.config_exception import ConfigException
from yarl import URL

from controlplane import errors
from controlplane.k8s.limiting import TokenBucket
from controlplane.resources import FIELD_MANAGER, Ref, Resource
from kit import files
from kit.backoff import Backoff
from kit.options import SettingsError

__all__ = ["KubeClient", "KubeSettings", "Listing", "WatchEvent", "open_client"]

log = logging.getLogger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
_TYPES: Final = {200: "object", 201: "object", 202: "object"}
PAGE: Final = 500
"""Items per list page (client-go's pager default)."""
_LIST_RESTARTS: Final = 3
"""How often a list whose continue token expired starts over before the 410 is raised."""


def kubeconfig_from(flag: str, env: Mapping[str, str]) -> str | None:
    """``--kubeconfig`` (else ``$KUBECONFIG``): ``None`` for in-cluster or the default file,
    ``"none"`` for no cluster, else a path that must be a regular file no larger than any
    kubeconfig (the loader reads it whole), checked here so a bad one exits 2 at start-up.

    :raises SettingsError: naming ``--kubeconfig`` and the reason.
    """
    kubeconfig = flag or env.get("KUBECONFIG") or None
    if kubeconfig not in (None, "none"):
        try:
            files.read_capped(kubeconfig)
        except files.InputRefused as e:
            raise SettingsError(f"--kubeconfig (or KUBECONFIG): {e}") from e
    return kubeconfig


class KubeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach the API. ``host`` (tests) wins over ``kubeconfig``; else in-cluster, else
    the default kubeconfig."""

    host: str | None = None
    kubeconfig: str | None = None
    qps: float
    """``--kube-conn-qps`` (this and the next three have no default here: the command table's
    is the one; tests say theirs through :meth:`for_tests`)."""
    burst: int
    """``--kube-conn-burst``."""
    timeout_s: float
    """``--kube-conn-timeout``: the bound on one request."""
    max_retries: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    relist_s: float
    """``--informer-cache-resync-period``: a watch resumed this long after the last full list of
    its collection starts over with a full list instead (0: never)."""

    @classmethod
    def for_tests(cls, host: str | None = None, **kw: Any) -> KubeSettings:
        """A client of a test's API server at ``host``: never throttled by its own rate limit,
        a hung request failing within a minute, no relist during a test."""
        base = cls(host=host, qps=1000.0, burst=2000, timeout_s=60.0, relist_s=3600.0)
        return msgspec.structs.replace(base, **kw)

    @property
    def backoff(self) -> Backoff:
        """The retry schedule of a 429/5xx: ``backoff_s`` doubling to ``max_backoff_s``, never
        shorter than the answer's ``Retry-After`` (itself capped)."""
        return Backoff(min(self.backoff_s, self.max_backoff_s), self.max_backoff_s)


Observer = Callable[[str, str], None]
"""Called with ``(verb, result)`` after every request; ``result`` is the status code or ``error``."""


class WatchEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One change of a watched collection."""

    type: str
    """``ADDED``, ``MODIFIED``, ``DELETED`` or ``BOOKMARK``."""
    object: dict[str, Any]


class Listing(msgspec.Struct, frozen=True, kw_only=True):
    """A whole collection as one list saw it."""

    items: list[dict[str, Any]]
    resource_version: str
    """The list's ``metadata.resourceVersion``: a watch from it misses nothing after the list."""


class KubeClient:
    """JSON in, JSON out, our errors only."""

    def __init__(self, api: k8s.ApiClient, settings: KubeSettings, observe: Observer) -> None:
        self._api = api
        self._settings = settings
        self._bucket = TokenBucket(settings.qps, settings.burst)
        self._observe = observe
        self._listed: dict[str, float] = {}
        """Per collection path: when a watch last started without a resourceVersion."""
        self.relists = 0
        """Watches started over with a full list because ``relist_s`` had passed."""

    async def get(self, ref: Ref) -> dict[str, Any]:
        """:raises NotFound: no such object."""
        return await self.request("GET", ref.path())  # type: ignore[no-any-return]

    async def list(
        self, resource: Resource, namespace: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Every object of the collection (paged, see :meth:`listing`)."""
        return (await self.listing(resource, namespace)).items

    async def listing(
        self, resource: Resource, namespace: str | None = None, *, limit: int = PAGE
    ) -> Listing:
        """The collection in pages of ``limit``, and the resourceVersion the list started at.

        :raises Gone: the continue token expired ``_LIST_RESTARTS`` times in a row.
        """
        path = resource.collection_path(namespace)
        restarts = 0
        while True:
            try:
                return await self._pages(path, limit)
            except errors.Gone:
                if restarts >= _LIST_RESTARTS:
                    raise
                restarts += 1
                log.debug("list %s: the continue token expired; listing from the start", path)

    async def _pages(self, path: str, limit: int) -> Listing:
        """One paged list, first page to last (a 410 means a continue token expired)."""
        items: builtins.list[dict[str, Any]] = []
        token = ""
        version = ""
        while True:
            query = [("limit", str(limit))]
            if token:
                query.append(("continue", token))
            body = await self.request("GET", path, query=query)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            token = str(meta.get("continue") or "")
            if not token:
                return Listing(items=items, resource_version=version)

    async def create(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        """:raises Conflict: it exists already."""
        path = ref.resource.collection_path(ref.namespace)
        return await self.request("POST", path, body)  # type: ignore[no-any-return]

    async def patch(
        self, ref: Ref, body: dict[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch; ``body.metadata.resourceVersion`` makes it conditional.

        :raises Conflict: the precondition failed. :raises NotFound: no such object.
        """
        path = ref.path(subresource)
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH)  # type: ignore[no-any-return]

    async def replace(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any]:
        """PUT the whole object (``metadata.resourceVersion`` required by the server)."""
        return await self.request("PUT", ref.path(), body)  # type: ignore[no-any-return]

    async def apply(
        self, ref: Ref, body: dict[str, Any], *, field_manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        """Server-side apply as ``field_manager`` (``gpustack-operator``), forcing ownership."""
        query = [("fieldManager", field_manager), ("force", "true")]
        return await self.request(  # type: ignore[no-any-return]
            "PATCH", ref.path(), body, content_type=APPLY_PATCH, query=query
        )

    async def delete(self, ref: Ref) -> None:
        """:raises NotFound: already gone."""
        await self.request("DELETE", ref.path())

    async def watch(
        self,
        resource: Resource,
        *,
        resource_version: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Changes of ``resource`` (cluster-wide) until the server ends the stream.

        Without ``resource_version`` the server first sends every existing object as ``ADDED``.
        The stream ends after about ``timeout_s``; the caller watches again from the last
        ``resourceVersion`` it saw. Not retried here: a broken stream is the caller's to redo.

        :raises Gone: ``resource_version`` is too old (410): list again, then watch.
        :raises ApiError: the request failed.
        """
        path = resource.collection_path()
        resource_version = self._resume_from(path, resource_version)

        async def start(**kw: Any) -> Any:
            query = [("watch", "true"), ("timeoutSeconds", str(kw["timeout_seconds"]))]
            if kw.get("resource_version"):
                query.append(("resourceVersion", str(kw["resource_version"])))
            await self._throttle()
            return await self._api.call_api(
                path, "GET", query_params=query, header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(connect=30, sock_read=timeout_s + 30),
            )  # fmt: skip

        # No return type: each event is decoded once. With one ("object") the library encodes
        # the decoded object again and decodes that (three passes over every Node, 44 -> 13 us
        # for a 2.5 KB event). ``start`` has no docstring, where it would look for one.
        stream = k8s_watch.Watch()
        try:
            async with stream:
                events = stream.stream(
                    start, resource_version=resource_version, timeout_seconds=timeout_s
                )
                async for raw in events:
                    yield WatchEvent(type=str(raw["type"]), object=raw["raw_object"])
        except k8s.ApiException as e:
            self._observe("watch", str(e.status))
            status = int(e.status or 0)
            raise errors.for_status(status, _message(e.body) or str(e.reason or "")) from e
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
            self._observe("watch", "error")
            raise self._unreached(e, f"watch {path}") from e

    def _resume_from(self, path: str, resource_version: str | None) -> str | None:
        """``resource_version``, or None once ``relist_s`` passed since the last full list of
        ``path`` (the stream then replays every object as ``ADDED``: a full re-list)."""
        now = time.monotonic()
        last = self._listed.get(path)
        relist = self._settings.relist_s
        if resource_version and last is not None and relist > 0 and now - last >= relist:
            self.relists += 1
            log.debug("watch %s: %.0fs since the last full list; listing again", path, relist)
            resource_version = None
        if not resource_version:
            self._listed[path] = now
        return resource_version

    async def _throttle(self) -> None:
        wait = self._bucket.reserve()
        if wait > 0:
            await anyio.sleep(wait)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: builtins.list[tuple[str, str]] | None = None,
    ) -> Any:
        """One request with rate limiting and retries on 429/5xx."""
        schedule = self._settings.backoff
        for attempt in itertools.count():
            try:
                return await self._once(method, path, body, content_type, query or [])
            except (errors.TooManyRequests, errors.ServerError) as e:
                if attempt >= self._settings.max_retries:
                    raise
                delay = schedule.delay_s(attempt, at_least_s=e.retry_after_s)
                log.debug("%s %s: %s; retrying in %.2fs", method, path, e, delay)
                await anyio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str,
        query: builtins.list[tuple[str, str]],
    ) -> Any:
        await self._throttle()
        verb = _verb(method, path)
        try:
            result = await self._api.call_api(
                path,
                method,
                query_params=query,
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                response_types_map=_TYPES,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=self._settings.timeout_s,
            )
        except k8s.ApiException as e:
            self._observe(verb, str(e.status))
            raise errors.for_status(
                int(e.status or 0), _message(e.body), retry_after_s=_retry_after(e.headers)
            ) from e
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            self._observe(verb, "error")
            raise self._unreached(e, f"{method} {path}") from e
        self._observe(verb, "ok")
        return result

    def _unreached(self, error: BaseException, what: str) -> errors.ServerError:
        """Status 0: the server was not reached. The message says which server, where it came
        from and what a person can do, before the cause (an ApiError keeps 300 characters)."""
        return errors.ServerError(
            0, unreached_message(self._api.configuration.host, self._settings, error, what)
        )


def _verb(method: str, path: str) -> str:
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, "get"
    )


def _message(body: Any) -> str:
    try:
        return str(json.loads(body).get("message", body))
    except (TypeError, ValueError, AttributeError):
        return str(body or "")


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers else None
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


async def _configuration(settings: KubeSettings) -> k8s.Configuration:
    conf = k8s.Configuration()
    if settings.host:
        conf.host = settings.host
        return conf
    try:
        if settings.kubeconfig:
            await k8s_config.load_kube_config(
                config_file=settings.kubeconfig, client_configuration=conf
            )
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
            except ConfigException:
                await k8s_config.load_kube_config(client_configuration=conf)
    except (ConfigException, OSError, TypeError, ValueError, yaml.YAMLError) as e:
        tried = (
            f"the kubeconfig {settings.kubeconfig}"
            if settings.kubeconfig
            else "in-cluster service account, then ~/.kube/config"
        )
        raise errors.SinkUnavailable(
            f"no usable Kubernetes configuration ({tried}: {e}); this needs a cluster: point "
            "--kubeconfig or $KUBECONFIG at a kubeconfig, or run in a Pod (in-cluster config); "
            "or run without one: --kubeconfig=none --metrics-auth=none (the worker then keeps "
            "its ledger in the bus; 'gpustack-operator standalone' runs everything on one machine)"
        ) from e
    return conf


async def check_configuration(settings: KubeSettings) -> None:
    """Resolve the configuration :func:`open_client` will use, and only that: a process calls
    it before anything that retries (the bus), so a missing kubeconfig is told at once.

    :raises SinkUnavailable: no kubeconfig, no in-cluster service account, no ``host``.
    """
    await _configuration(settings)


def unreached_message(
    host: str | None, settings: KubeSettings, error: BaseException, what: str
) -> str:
    """Why a request never reached the API server, and what to do about it (pure)."""
    source = (
        "--host"
        if settings.host
        else f"the kubeconfig {settings.kubeconfig}"
        if settings.kubeconfig
        else "the in-cluster config or ~/.kube/config"
    )
    return (
        f"cannot reach the Kubernetes API server {host} (from {source}); is the cluster up and "
        "reachable from here? --kubeconfig or $KUBECONFIG chooses another; --kubeconfig=none "
        f"runs without a cluster ({what}: {type(error).__name__}: {error})"
    )


_READ_BUFSIZE: Final = 2**21
"""As ``kubernetes_asyncio`` sets it: one watch event may carry an object of up to etcd's 1.5 MiB."""


def _settle_environment(api: k8s.ApiClient) -> None:
    """Decide the API's proxy once, from the environment, instead of on every request.

    ``kubernetes_asyncio`` makes its aiohttp session with ``trust_env``, which looks up
    ``HTTP(S)_PROXY``/``NO_PROXY`` and ``~/.netrc`` in a worker thread for every request
    (about 14 % of the worker's CPU at 10,000 nodes). A process's environment does not change,
    so the proxy for the API's host is settled here with aiohttp's own rules (what client-go
    does with the same variables) and the session stops consulting the environment.
    ``~/.netrc`` is no way to authenticate to the Kubernetes API (the kubeconfig is).
    """
    rest = api.rest_client
    if not rest.proxy:
        try:
            proxy, auth = aiohttp.helpers.get_env_proxy_for_url(URL(api.configuration.host or ""))
        except LookupError:
            pass
        else:
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {
                    **(rest.proxy_headers or {}),
                    "Proxy-Authorization": auth.encode(),
                }
    trusting = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=trusting.connector, trust_env=False, read_bufsize=_READ_BUFSIZE
    )
    trusting.detach()


@asynccontextmanager
async def open_client(
    settings: KubeSettings, *, observe: Observer = lambda verb, result: None
) -> AsyncIterator[KubeClient]:
    """A client for the configured API; its connections are closed on exit (shielded).

    :raises SinkUnavailable: no kubeconfig, no in-cluster service account, no ``host``.
    """
    conf = await _configuration(settings)
    api = k8s.ApiClient(configuration=conf)
    _settle_environment(api)
    try:
        yield KubeClient(api, settings, observe)
    finally:
        with anyio.move_on_after(5, shield=True):
            await api.close()

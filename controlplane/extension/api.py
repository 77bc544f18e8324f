"""The extension API's HTTP surface: authentication, authorization, then the API-serving core.

Every request under ``/apis`` and ``/openapi`` is authenticated (:mod:`.auth`) unless
``--disable-auths``; discovery and OpenAPI then need nothing more (as the built-in
``system:discovery`` role grants); a resource request is authorized with a SubjectAccessReview
of what :meth:`~controlplane.extension.core.server.ApiServer.route` says it is, and answered by
the core (:mod:`controlplane.extension.core`): ``gpustack.ai/v1`` (:mod:`.objects`,
:mod:`.served`) and any further group versions passed as ``groups``.

Errors are ``metav1.Status`` documents with ``details``. Who made each request and what it did
is left on the request (:data:`audit.INFO_KEY`) for the audit log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from aiohttp import web

from bus import events
from controlplane.clustersettings.source import SettingsSource
from controlplane.extension import objects
from controlplane.extension.audit import INFO_KEY, RequestInfo
from controlplane.extension.auth import (
    ANONYMOUS,
    Attributes,
    Authenticator,
    AuthFailure,
    Authorizer,
    Unavailable,
    User,
)
from controlplane.extension.core.failures import ApiFailure
from controlplane.extension.core.model import GroupVersion, Provider
from controlplane.extension.core.server import ApiServer, json_response
from controlplane.extension.fleetview import GatewayReader, GatewayUnavailable
from controlplane.extension.served import SettingsProvider, ViewProvider
from kit.access import bearer_token
from kit.gating import peer_certificate
from kit.listening import Handler

__all__ = ["ExtensionApi", "RequestInfo"]

log = logging.getLogger(__name__)


class ExtensionApi:
    """The handlers of ``/apis`` and ``/openapi``; ``authenticator``/``authorizer`` None:
    ``--disable-auths``. ``groups``: more group versions to serve beside ``gpustack.ai/v1``."""

    def __init__(
        self,
        *,
        source: SettingsSource,
        namespace: str,
        samples: Callable[[], Mapping[str, events.SamplesEvent]],
        models: Callable[[], Iterable[tuple[str, tuple[events.ModelState, ...]]]],
        authenticator: Authenticator | None,
        authorizer: Authorizer | None,
        fleet: GatewayReader | None = None,
        groups: Sequence[tuple[GroupVersion, Mapping[str, Provider]]] = (),
    ) -> None:
        self._fleet = fleet
        """The worker-gateway beside the worker (``--worker-gateway-unix-path``); None: none."""
        self._samples = samples
        self._models = models
        self._authenticator = authenticator
        self._authorizer = authorizer
        providers: dict[str, Provider] = {
            "settings": SettingsProvider(source, namespace),
            "nodeutilizations": ViewProvider("nodeutilizations", self._utilizations),
            "modeldownloads": ViewProvider("modeldownloads", self._downloads),
            "aggregatedinstancetypes": ViewProvider("aggregatedinstancetypes", self._fleet_items),
        }
        self.core = ApiServer([(objects.GROUP_VERSION_SPEC, providers), *groups])

    def handlers(self) -> dict[str, Handler]:
        return {"/apis": self.handle, "/apis/{tail:.*}": self.handle,
                "/openapi/v2": self.handle, "/openapi/v3": self.handle,
                "/openapi/v3/{tail:.*}": self.handle}  # fmt: skip

    async def handle(self, request: web.Request) -> web.StreamResponse:
        info = request[INFO_KEY] = RequestInfo()
        try:
            response = await self._handle(request, info)
        except ApiFailure as e:
            response = json_response(e.code, e.status())
        info.code = response.status
        return response

    async def _handle(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        info.user = await self._authenticate(request)
        accept = request.headers.get("Accept", "")
        if request.path.startswith("/openapi"):
            _read_only(request)
            return self.core.openapi(request.path, accept)
        r = self.core.route(request.path, request.method, request.query)
        if r is None:
            _read_only(request)
            return self.core.discovery(request.path, accept)
        info.attrs = Attributes(verb=r.verb, group=r.gv.group, version=r.gv.version,
                                resource=r.resource.plural, namespace=r.namespace, name=r.name,
                                subresource=r.subresource)  # fmt: skip
        self.core.allowed(r)  # 405 before asking anyone: it is not about who asks
        await self._authorize(info.user, info.attrs)
        return await self.core.serve(request, r, info.user.name)

    async def _utilizations(self) -> list[dict[str, Any]]:
        return [objects.utilization(e) for _, e in sorted(self._samples().items())]

    async def _downloads(self) -> list[dict[str, Any]]:
        return [objects.downloads(n, m) for n, m in sorted(self._models())]

    async def _fleet_items(self) -> list[dict[str, Any]]:
        """The gateway's aggregate, re-labelled into this group (read through on each call)."""
        if self._fleet is None:
            raise ApiFailure(
                503, "ServiceUnavailable",
                "no worker-gateway beside this worker (--worker-gateway-unix-path is empty)",
            )  # fmt: skip
        try:
            items = await self._fleet.items()
        except GatewayUnavailable as e:
            raise ApiFailure(503, "ServiceUnavailable", str(e)) from e
        # the gateway's versions are its own process's count (each replica has its own
        # gateway): not a shared store version, so the core counts instead
        return [{**i, "apiVersion": objects.GROUP_VERSION, "metadata": {
            k: v for k, v in (i.get("metadata") or {}).items() if k != "resourceVersion"}}
            for i in items]  # fmt: skip

    async def _authenticate(self, request: web.Request) -> User:
        if self._authenticator is None:
            return User(name=ANONYMOUS, groups=("system:unauthenticated",))
        token = bearer_token(request.headers.get("Authorization"))
        try:
            return await self._authenticator.authenticate(
                peer_certificate(request), request.headers, token
            )
        except AuthFailure as e:
            raise ApiFailure(401, "Unauthorized", f"Unauthorized: {e}") from e

    async def _authorize(self, user: User, attrs: Attributes) -> None:
        if self._authorizer is None:
            return
        try:
            allowed, reason = await self._authorizer.allowed(user, attrs)
        except Unavailable as e:
            raise ApiFailure(503, "ServiceUnavailable", str(e)) from e
        if not allowed:
            what = attrs.resource + (f" {attrs.name!r}" if attrs.name else "")
            why = f": {reason}" if reason else ""
            raise ApiFailure(
                403, "Forbidden",
                f"{what} is forbidden: User {user.name!r} cannot {attrs.verb} resource "
                f"{attrs.resource!r} in API group {attrs.group!r}{why}",
                details={"name": attrs.name, "group": attrs.group, "kind": attrs.resource},
            )  # fmt: skip


def _read_only(request: web.Request) -> None:
    if request.method not in ("GET", "HEAD"):
        raise ApiFailure(405, "MethodNotAllowed", "discovery and OpenAPI are read-only")

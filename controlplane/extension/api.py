"""The extension API's HTTP surface: discovery, ``settings`` and the read-only views.

Every request under ``/apis`` is authenticated and, for resources, authorized
(:mod:`controlplane.extension.auth`) unless ``--disable-auths``; then routed by path:

- ``/apis``, ``/apis/gpustack.ai``, ``/apis/gpustack.ai/v1``: discovery (any authenticated user);
- ``/apis/gpustack.ai/v1[/namespaces/<ns>]/<resource>[/<name>]``: GET (get, list, and watch
  with ``?watch=1``), PUT (update) and PATCH (merge, strategic-merge treated as merge, and
  server-side apply) of ``settings``; GET of the views. Other verbs are 405.

Errors are ``metav1.Status`` documents with the HTTP code (400, 401, 403, 404, 405, 409, 422,
503). Who made each request and what it did is left on the request (:data:`audit.INFO_KEY`)
for the audit log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import anyio
import yaml
from aiohttp import web

from bus import events
from controlplane import errors, settingscatalog
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
from controlplane.extension.fleetview import GatewayReader, GatewayUnavailable
from controlplane.settingscatalog import BY_NAME, CATALOG
from controlplane.settingsource import SettingsSource
from kit.access import bearer_token
from kit.serving import Handler, peer_certificate

__all__ = ["ExtensionApi", "RequestInfo"]

log = logging.getLogger(__name__)

PREFIX: Final = f"/apis/{objects.GROUP}/{objects.VERSION}"
WATCH_TIMEOUT_S: Final = 1800


class Failure(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason


def _json(code: int, doc: dict[str, Any]) -> web.Response:
    return web.Response(status=code, text=json.dumps(doc), content_type="application/json")


def _fail(e: Failure) -> web.Response:
    return _json(e.code, objects.status(e.code, e.reason, str(e)))


_VERBS: Final = {"PUT": "update", "PATCH": "patch", "POST": "create", "DELETE": "delete"}


def parse_path(path: str, method: str, watch: bool) -> Attributes | None:
    """The request's attributes; None for a discovery path. :raises Failure: 404."""
    if path.rstrip("/") in ("/apis", f"/apis/{objects.GROUP}", PREFIX):
        return None
    if not path.startswith(PREFIX + "/"):
        raise Failure(404, "NotFound", f"{path} is not served here")
    parts = [p for p in path[len(PREFIX) :].split("/") if p]
    namespace = ""
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    if not parts or len(parts) > 2 or parts[0] not in objects.RESOURCES:
        raise Failure(404, "NotFound", f"{path} is not served here")
    info = objects.RESOURCES[parts[0]]
    if namespace and not info.namespaced:
        raise Failure(404, "NotFound", f"{info.name} are not namespaced")
    name = parts[1] if len(parts) == 2 else ""
    verb = _VERBS.get(method) or ("get" if name else ("watch" if watch else "list"))
    return Attributes(verb=verb, group=objects.GROUP, version=objects.VERSION,
                      resource=info.name, namespace=namespace, name=name)  # fmt: skip


def is_watch(query: Mapping[str, str]) -> bool:
    return query.get("watch", "") not in ("", "0", "false")


class ExtensionApi:
    """The handlers of ``/apis``; ``authenticator``/``authorizer`` None: ``--disable-auths``."""

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
    ) -> None:
        self._fleet = fleet
        """The worker-gateway beside the worker (``--worker-gateway-unix-path``); None: none."""
        self._source = source
        self._namespace = namespace
        self._samples = samples
        self._models = models
        self._authenticator = authenticator
        self._authorizer = authorizer

    def handlers(self) -> dict[str, Handler]:
        return {"/apis": self.handle, "/apis/{tail:.*}": self.handle}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        info = request[INFO_KEY] = RequestInfo()
        try:
            response = await self._handle(request, info)
        except Failure as e:
            response = _fail(e)
        info.code = response.status
        return response

    async def _handle(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        watch = is_watch(request.query)
        info.user = await self._authenticate(request)
        attrs = info.attrs = parse_path(request.path, request.method, watch)
        if attrs is None:
            if request.method != "GET":
                raise Failure(405, "MethodNotAllowed", "discovery is read-only")
            return self._discovery(request.path)
        if attrs.verb not in objects.RESOURCES[attrs.resource].verbs:
            raise Failure(405, "MethodNotAllowed", f"{attrs.resource}: no {attrs.verb}")
        await self._authorize(info.user, attrs)
        if attrs.resource == "settings":
            if attrs.verb in ("update", "patch"):
                return await self._write(request, attrs, await request.read())
            if attrs.verb == "watch":
                return await self._watch(request, attrs)
            return self._read_settings(request, attrs)
        if attrs.resource == "aggregatedinstancetypes":
            return await self._read_fleet(attrs)
        return self._read_view(attrs)

    async def _read_fleet(self, attrs: Attributes) -> web.Response:
        """The gateway's aggregate, re-labelled into this group (read through on each call)."""
        if self._fleet is None:
            raise Failure(
                503, "ServiceUnavailable",
                "no worker-gateway beside this worker (--worker-gateway-unix-path is empty)",
            )  # fmt: skip
        try:
            items = await self._fleet.items()
        except GatewayUnavailable as e:
            raise Failure(503, "ServiceUnavailable", str(e)) from e
        items = [{**i, "apiVersion": objects.GROUP_VERSION} for i in items]
        if attrs.name:
            found = [i for i in items if (i.get("metadata") or {}).get("name") == attrs.name]
            if not found:
                raise Failure(404, "NotFound", f'aggregatedinstancetypes "{attrs.name}" not found')
            return _json(200, found[0])
        return _json(200, objects.listed("AggregatedInstanceType", items, "0"))

    async def _authenticate(self, request: web.Request) -> User:
        if self._authenticator is None:
            return User(name=ANONYMOUS, groups=("system:unauthenticated",))
        token = bearer_token(request.headers.get("Authorization"))
        try:
            return await self._authenticator.authenticate(
                peer_certificate(request), request.headers, token
            )
        except AuthFailure as e:
            raise Failure(401, "Unauthorized", f"Unauthorized: {e}") from e

    async def _authorize(self, user: User, attrs: Attributes) -> None:
        if self._authorizer is None:
            return
        try:
            allowed, reason = await self._authorizer.allowed(user, attrs)
        except Unavailable as e:
            raise Failure(503, "ServiceUnavailable", str(e)) from e
        if not allowed:
            what = attrs.resource + (f" {attrs.name!r}" if attrs.name else "")
            why = f": {reason}" if reason else ""
            raise Failure(
                403, "Forbidden",
                f"{what} is forbidden: User {user.name!r} cannot {attrs.verb} resource "
                f"{attrs.resource!r} in API group {attrs.group!r}{why}",
            )  # fmt: skip

    def _discovery(self, path: str) -> web.Response:
        path = path.rstrip("/")
        if path == "/apis":
            group = objects.api_group()
            return _json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})
        if path == f"/apis/{objects.GROUP}":
            return _json(200, objects.api_group())
        return _json(200, objects.api_resource_list())

    def _settings_items(self) -> list[dict[str, Any]]:
        stored = self._source.stored
        return [
            objects.setting(e, stored.data.get(e.name, e.default), namespace=self._namespace,
                            version=stored.version, created=stored.created)
            for e in CATALOG
        ]  # fmt: skip

    def _in_namespace(self, attrs: Attributes) -> bool:
        return attrs.namespace in ("", self._namespace)

    def _read_settings(self, request: web.Request, attrs: Attributes) -> web.Response:
        items = self._settings_items() if self._in_namespace(attrs) else []
        if attrs.name:
            found = [i for i in items if i["metadata"]["name"] == attrs.name]
            if not attrs.namespace or not found:
                raise Failure(404, "NotFound", f'settings "{attrs.name}" not found')
            return _json(200, found[0])
        version = self._source.stored.version
        if "as=Table" in request.headers.get("Accept", ""):
            return _json(200, objects.settings_table(items, version))
        return _json(200, objects.listed("Setting", items, version))

    def _read_view(self, attrs: Attributes) -> web.Response:
        if attrs.resource == "nodeutilizations":
            kind = "NodeUtilization"
            items = [objects.utilization(e) for _, e in sorted(self._samples().items())]
        else:
            kind = "ModelDownload"
            items = [objects.downloads(n, m) for n, m in sorted(self._models())]
        if attrs.name:
            found = [i for i in items if i["metadata"]["name"] == attrs.name]
            if not found:
                raise Failure(404, "NotFound", f'{attrs.resource} "{attrs.name}" not found')
            return _json(200, found[0])
        return _json(200, objects.listed(kind, items, "0"))

    async def _write(self, request: web.Request, attrs: Attributes, body: bytes) -> web.Response:
        if not attrs.name or attrs.namespace != self._namespace or attrs.name not in BY_NAME:
            raise Failure(404, "NotFound", f'settings "{attrs.name}" not found')
        doc = _decode(body, request.content_type)
        wanted = (doc.get("metadata") or {}).get("resourceVersion")
        if attrs.verb == "update" and wanted and wanted != self._source.stored.version:
            raise Failure(409, "Conflict", "the object has been modified; read it again")
        value = (doc.get("spec") or {}).get("value")
        if not isinstance(value, str):
            raise Failure(422, "Invalid", "spec.value: Required value: a string")
        try:
            await self._source.write(attrs.name, value)
        except settingscatalog.InvalidSetting as e:
            raise Failure(422, "Invalid", str(e)) from e
        except errors.Conflict as e:
            raise Failure(409, "Conflict", f"{e}; read it again") from e
        except errors.ApiError as e:
            raise Failure(503, "ServiceUnavailable", f"cannot store the setting: {e}") from e
        entry = BY_NAME[attrs.name]
        stored = self._source.stored
        response = _json(200, objects.setting(entry, stored.data.get(entry.name, entry.default),
                                              namespace=self._namespace, version=stored.version,
                                              created=stored.created))  # fmt: skip
        if entry.inert:  # kubectl prints it as "Warning: ..."
            response.headers["Warning"] = f'299 - "{entry.name}: {settingscatalog.INERT_NOTE}"'
        return response

    async def _watch(self, request: web.Request, attrs: Attributes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        timeout = _timeout(request.query.get("timeoutSeconds"))
        since = request.query.get("resourceVersion", "")
        async with self._source.changes() as changes:
            before = dict(self._source.stored.data)
            if since != self._source.stored.version:  # a fresh watch: everything, as ADDED
                for item in self._settings_items() if self._in_namespace(attrs) else []:
                    if not attrs.name or item["metadata"]["name"] == attrs.name:
                        await _event(response, "ADDED", item)
            with anyio.move_on_after(timeout):
                async for stored in changes:
                    for item in self._settings_items() if self._in_namespace(attrs) else []:
                        name = item["metadata"]["name"]
                        if before.get(name) != stored.data.get(name) and (
                            not attrs.name or name == attrs.name
                        ):
                            await _event(response, "MODIFIED", item)
                    before = dict(stored.data)
        await response.write_eof()
        return response


async def _event(response: web.StreamResponse, kind: str, obj: dict[str, Any]) -> None:
    await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


def _timeout(text: str | None) -> float:
    try:
        value = float(text) if text else WATCH_TIMEOUT_S
    except ValueError:
        raise Failure(400, "BadRequest", f"timeoutSeconds {text!r} is not a number") from None
    return max(0.0, min(value, WATCH_TIMEOUT_S))


def _decode(body: bytes, content_type: str) -> dict[str, Any]:
    """A JSON (or, for server-side apply, YAML) object. :raises Failure: 400 otherwise."""
    try:
        if content_type == "application/apply-patch+yaml":
            doc = yaml.safe_load(body.decode())
        else:
            doc = json.loads(body)
    except (ValueError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise Failure(400, "BadRequest", f"the body is not a document: {e}") from None
    if not isinstance(doc, dict):
        raise Failure(400, "BadRequest", "the body is not an object")
    return doc

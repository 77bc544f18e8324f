"""Auditing the worker's APIs: one ``audit.k8s.io/v1`` Event per request to the extension API
(``/apis``) and the webhooks (``/webhooks``), at the level the policy gives it.

- Policy (``--audit-policy-file``): an ``audit.k8s.io/v1`` ``Policy``; its ``rules`` are tried in
  order and the first that matches sets the level (``None``, ``Metadata``, ``Request``;
  ``RequestResponse`` is read as ``Request``: response bodies are not kept). A rule matches when
  every selector it has matches: ``users``, ``userGroups``, ``verbs``, ``namespaces``,
  ``resources`` (``group`` and ``resources``; resource requests only), ``nonResourceURLs``
  (exact, or a prefix ending in ``*``; other requests only). No rule matching: ``None``. Without
  a policy file every request is audited at ``Metadata``.
- Backends: ``--audit-log-path`` appends one JSON line per event (``-``: standard output);
  ``--audit-webhook-config-file`` (a kubeconfig: the first cluster's ``server``,
  ``certificate-authority-data``, ``insecure-skip-tls-verify``; the first user's ``token``) gets
  ``EventList`` batches POSTed.

Events are queued (bounded, :data:`QUEUE`; a full queue drops and counts, never blocks a request)
and written by one task. An event is queued before its response goes out, and leaving
:meth:`Auditor.running`, cancelled included (a stopping worker), first writes what is queued,
shielded and within :data:`FLUSH_S`: a request the client saw answered is in the log. Parsing is
at the edge: a bad file stops the worker with one line.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import ssl
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import IO, Any, Final

import aiohttp
import anyio
import msgspec
import yaml
from aiohttp import typedefs, web

from controlplane.extension.auth import Attributes, User
from kit.files import InputRefused, read_capped

__all__ = [
    "INFO_KEY",
    "AuditSettings",
    "Auditor",
    "RequestInfo",
    "Rule",
    "WebhookTarget",
    "audited",
    "level_for",
]

log = logging.getLogger(__name__)

LEVELS: Final = ("None", "Metadata", "Request", "RequestResponse")
QUEUE: Final = 1024
BATCH: Final = 100
FLUSH_S: Final = 5.0
"""How long leaving :meth:`Auditor.running` may spend writing what is still queued."""


@dataclass
class RequestInfo:
    """What the audit log needs of one request, filled in by the handler as it understands it."""

    user: User | None = None
    attrs: Attributes | None = None
    code: int = 0


INFO_KEY: Final = web.RequestKey("gpustack.request_info", RequestInfo)
"""Where a handler leaves who called and what the request did, for the audit middleware."""


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    level: str
    users: tuple[str, ...] = ()
    user_groups: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    resources: tuple[tuple[str, tuple[str, ...]], ...] = ()
    non_resource_urls: tuple[str, ...] = ()


class WebhookTarget(msgspec.Struct, frozen=True, kw_only=True):
    server: str
    ca_pem: bytes | None = None
    insecure: bool = False
    token: str | None = None


class AuditSettings(msgspec.Struct, frozen=True, kw_only=True):
    log_path: str | None = None
    rules: tuple[Rule, ...] | None = None
    """None: no policy file, every request at Metadata."""
    webhook: WebhookTarget | None = None

    @property
    def enabled(self) -> bool:
        return self.log_path is not None or self.webhook is not None


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"{what} must be a list of strings")


def _rule(raw: Any) -> Rule:
    raw = raw if isinstance(raw, dict) else {"level": "(not a mapping)"}
    level = raw.get("level")
    if level not in LEVELS:
        raise ValueError(f"level {level!r} is not one of {', '.join(LEVELS)}")
    resources = tuple(
        (str(r.get("group", "")), _strings(r.get("resources"), "resources.resources"))
        for r in raw.get("resources") or []
    )
    return Rule(
        level="Request" if level == "RequestResponse" else level,
        users=_strings(raw.get("users"), "users"),
        user_groups=_strings(raw.get("userGroups"), "userGroups"),
        verbs=_strings(raw.get("verbs"), "verbs"),
        namespaces=_strings(raw.get("namespaces"), "namespaces"),
        resources=resources,
        non_resource_urls=_strings(raw.get("nonResourceURLs"), "nonResourceURLs"),
    )


def policy_from(path: str) -> tuple[Rule, ...]:
    """The rules of a Policy file. :raises ValueError: unreadable, over the input cap
    (:func:`kit.files.read_capped`), or not a Policy."""
    try:
        doc = yaml.safe_load(read_capped(path))
    except InputRefused as e:
        raise ValueError(str(e)) from e
    except yaml.YAMLError as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    if not isinstance(doc, dict) or doc.get("kind") != "Policy":
        raise ValueError(f"{path} is not an audit.k8s.io Policy")
    return tuple(_rule(r) for r in doc.get("rules") or [])


def webhook_from(path: str) -> WebhookTarget:
    """The audit webhook from a kubeconfig file. :raises ValueError: unusable."""
    try:
        doc = yaml.safe_load(read_capped(path))
    except InputRefused as e:
        raise ValueError(str(e)) from e
    except yaml.YAMLError as e:
        raise ValueError(f"{path} is not a kubeconfig naming a server: {e}") from e
    try:
        cluster = doc["clusters"][0]["cluster"]
        server = str(cluster["server"])
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"{path} is not a kubeconfig naming a server: {e}") from e
    if not server.startswith(("http://", "https://")):
        raise ValueError(f"{path}: server {server!r} is not an http(s) URL")
    ca = cluster.get("certificate-authority-data")
    users = doc.get("users") or []
    token = ((users[0] or {}).get("user") or {}).get("token") if users else None
    return WebhookTarget(
        server=server, ca_pem=base64.b64decode(ca) if ca else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")), token=token,
    )  # fmt: skip


def _url_matches(patterns: tuple[str, ...], path: str) -> bool:
    return any(path == p or (p.endswith("*") and path.startswith(p[:-1])) for p in patterns)


def _matches(rule: Rule, req: dict[str, Any]) -> bool:
    user = req["user"]
    checks = [
        not rule.users or user["username"] in rule.users,
        not rule.user_groups or bool(set(rule.user_groups) & set(user.get("groups") or ())),
        not rule.verbs or req["verb"] in rule.verbs,
    ]
    ref = req.get("objectRef")
    if ref is not None:
        checks += [
            not rule.non_resource_urls,
            not rule.namespaces or ref.get("namespace", "") in rule.namespaces,
            not rule.resources or any(
                g == ref["apiGroup"] and (not rs or ref["resource"] in rs)
                for g, rs in rule.resources
            ),
        ]  # fmt: skip
    else:
        checks += [
            not rule.resources and not rule.namespaces,
            not rule.non_resource_urls or _url_matches(rule.non_resource_urls, req["path"]),
        ]
    return all(checks)


def level_for(rules: tuple[Rule, ...] | None, req: dict[str, Any]) -> str:
    """The level of a request described as :func:`audited` describes it (pure)."""
    if rules is None:
        return "Metadata"
    return next((r.level for r in rules if _matches(r, req)), "None")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def audited(request: web.Request, code: int, received: str) -> dict[str, Any]:
    """The Event's metadata for one answered request (``level`` and body added by the caller)."""
    info = request.get(INFO_KEY)
    user: dict[str, Any] = {"username": "system:unknown"}
    ref = None
    verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}.get(
        request.method, request.method.lower()
    )
    if info is not None and info.user is not None:
        user = {"username": info.user.name, "groups": list(info.user.groups)}
    if info is not None and info.attrs is not None:
        a = info.attrs
        verb = a.verb
        ref = {"resource": a.resource, "apiGroup": a.group, "apiVersion": a.version}
        ref.update({k: v for k, v in (("namespace", a.namespace), ("name", a.name)) if v})
    event: dict[str, Any] = {
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "auditID": str(uuid.uuid4()),
        "stage": "ResponseComplete", "requestURI": request.path_qs, "path": request.path,
        "verb": verb, "user": user, "sourceIPs": [request.remote or ""],
        "userAgent": request.headers.get("User-Agent", ""), "responseStatus": {"code": code},
        "requestReceivedTimestamp": received, "stageTimestamp": _now(),
    }  # fmt: skip
    if ref is not None:
        event["objectRef"] = ref
    return event


class Auditor:
    """Queues events and writes them (file, webhook) from one task; see the module docstring."""

    def __init__(self, settings: AuditSettings) -> None:
        self._settings = settings
        self._send, self._receive = anyio.create_memory_object_stream[dict[str, Any]](QUEUE)
        self.dropped = 0

    def middleware(self) -> typedefs.Middleware:
        @web.middleware
        async def audit(request: web.Request, handler: typedefs.Handler) -> web.StreamResponse:
            if not request.path.startswith(("/apis", "/webhooks/")):
                return await handler(request)
            received = _now()
            response = await handler(request)
            body = await request.read() if request.body_exists else b""  # cached once read
            self.record(request, response.status, received, body)
            return response

        return audit

    def record(self, request: web.Request, code: int, received: str, body: bytes = b"") -> None:
        event = audited(request, code, received)
        level = level_for(self._settings.rules, event)
        if level == "None":
            return
        event.pop("path")
        event["level"] = level
        if level == "Request" and body:
            try:
                event["requestObject"] = json.loads(body)
            except ValueError:
                event["requestObject"] = body.decode(errors="replace")
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            self.dropped += 1

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Auditor]:
        """Write events while inside; what is queued when the block exits is flushed first."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._write)
            try:
                yield self
            finally:
                self._send.close()

    async def _write(self) -> None:
        """Write batches until the queue closes or the task is cancelled, then what is left.

        The file is opened shielded (a local, bounded step): a writer cancelled before it first
        ran still has somewhere to write what was queued.
        """
        out: IO[str] | None = None
        http = None
        with self._receive:
            try:
                with anyio.move_on_after(FLUSH_S, shield=True):
                    out = await self._open()
                if self._settings.webhook is not None:
                    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
                try:
                    async for event in self._receive:
                        await self._emit(out, http, self._batch([event]))
                finally:  # cancelled (the worker stops) or closed: write what is queued
                    with anyio.move_on_after(FLUSH_S, shield=True):
                        while batch := self._batch([]):
                            await self._emit(out, http, batch)
            finally:
                with anyio.CancelScope(shield=True):
                    if http is not None:
                        await http.close()
                    if out is not None and out is not sys.stdout:
                        await anyio.to_thread.run_sync(out.close)

    def _batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``batch`` topped up from the queue, without waiting, to at most :data:`BATCH`."""
        while len(batch) < BATCH:
            try:
                batch.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        return batch

    async def _open(self) -> IO[str] | None:
        path = self._settings.log_path
        if path is None:
            return None
        if path == "-":
            return sys.stdout
        return await anyio.to_thread.run_sync(lambda: open(path, "a", encoding="utf-8"))

    async def _emit(
        self, out: IO[str] | None, http: aiohttp.ClientSession | None, batch: list[dict[str, Any]]
    ) -> None:
        if out is not None:
            text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in batch)

            def write() -> None:
                out.write(text)
                out.flush()

            await anyio.to_thread.run_sync(write)
        target = self._settings.webhook
        if http is not None and target is not None:
            body = {"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "items": batch}
            headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
            try:
                async with http.post(target.server, json=body, headers=headers,
                                     ssl=_client_ssl(target)) as answer:  # fmt: skip
                    if answer.status >= 300:
                        log.warning("the audit webhook answered %d; %d events lost",
                                    answer.status, len(batch))  # fmt: skip
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                log.warning("the audit webhook failed (%s); %d events lost", e, len(batch))


def _client_ssl(target: WebhookTarget) -> ssl.SSLContext | bool:
    if not target.server.startswith("https://"):
        return True
    context = ssl.create_default_context()
    if target.ca_pem:
        context.load_verify_locations(cadata=target.ca_pem.decode())
    if target.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context

"""Who is calling the extension API, and may they: the aggregation layer's rules.

Authentication (:class:`Authenticator`), in the delegating order of ``k8s.io/apiserver``:

1. a client certificate that TLS verified against ``requestheader-client-ca-file`` (the
   front proxy, i.e. kube-apiserver): its CN must be in ``requestheader-allowed-names`` when that
   list is not empty; the user is then read from the ``requestheader-*`` headers (first non-empty
   username header, every value of the group headers, extras by prefix, lowercased and
   %-unescaped). The identity headers are trusted **only** with such a certificate;
2. else a bearer token, reviewed with TokenReview;
3. else 401.

Authorization (:class:`Authorizer`): a SubjectAccessReview with ``resourceAttributes`` per
request, decisions cached 10 s (allowed and denied alike; "could not decide" never), group
``system:masters`` always allowed. Discovery paths need only an authenticated user (what the
built-in ``system:discovery`` role grants every authenticated user).

The front-proxy configuration comes from the ConfigMap
``kube-system/extension-apiserver-authentication`` (:func:`load_front_proxy`), read at start-up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import unquote

import anyio
import msgspec

from controlplane import errors
from controlplane.access import reviewer
from controlplane.k8s.client import KubeClient
from controlplane.resources import CONFIGMAPS, SUBJECTACCESSREVIEWS, TOKENREVIEWS, Ref

__all__ = [
    "Attributes",
    "Authenticator",
    "Authorizer",
    "FrontProxy",
    "User",
    "load_front_proxy",
]

log = logging.getLogger(__name__)

AUTH_CONFIGMAP: Final = Ref(
    resource=CONFIGMAPS, name="extension-apiserver-authentication", namespace="kube-system"
)
ANONYMOUS: Final = "system:anonymous"


class FrontProxy(msgspec.Struct, frozen=True, kw_only=True):
    """The ``requestheader-*`` keys of the authentication ConfigMap."""

    client_ca: bytes
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    @classmethod
    def from_data(cls, data: Mapping[str, str]) -> FrontProxy | None:
        """None when the ConfigMap names no requestheader CA (no front proxy configured)."""
        ca = data.get("requestheader-client-ca-file", "")
        if not ca.strip():
            return None

        def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            text = data.get(key)
            if text is None:
                return default
            value = json.loads(text)
            return tuple(str(v) for v in value) if isinstance(value, list) else default

        return cls(
            client_ca=ca.encode(),
            allowed_names=names("requestheader-allowed-names", ()),
            username_headers=names("requestheader-username-headers", ("X-Remote-User",)),
            uid_headers=names("requestheader-uid-headers", ()),
            group_headers=names("requestheader-group-headers", ("X-Remote-Group",)),
            extra_prefixes=names("requestheader-extra-headers-prefix", ("X-Remote-Extra-",)),
        )


async def load_front_proxy(api: KubeClient) -> FrontProxy | None:
    """The front-proxy configuration; None (with a warning) when the ConfigMap is absent."""
    try:
        body = await api.get(AUTH_CONFIGMAP)
    except errors.NotFound:
        log.warning(
            "no ConfigMap kube-system/extension-apiserver-authentication: the extension API "
            "accepts bearer tokens only (no front-proxy client certificates)"
        )
        return None
    try:
        return FrontProxy.from_data(body.get("data") or {})
    except ValueError as e:
        log.warning("the extension-apiserver-authentication ConfigMap is unreadable: %s", e)
        return None


class User(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = msgspec.field(default_factory=dict)


class AuthFailure(Exception):
    """401: who is calling could not be established (the message says why)."""


def _common_name(cert: Mapping[str, Any]) -> str:
    for rdn in cert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def user_from_headers(proxy: FrontProxy, headers: Any) -> User:
    """The user the front proxy names in ``headers`` (a case-insensitive multi-dict)."""
    name = next((v for h in proxy.username_headers for v in headers.getall(h, []) if v), "")
    if not name:
        raise AuthFailure("the front proxy named no user")
    uid = next((v for h in proxy.uid_headers for v in headers.getall(h, []) if v), "")
    groups = tuple(v for h in proxy.group_headers for v in headers.getall(h, []))
    extra: dict[str, list[str]] = {}
    for header, value in headers.items():
        for prefix in proxy.extra_prefixes:
            if header.lower().startswith(prefix.lower()):
                key = unquote(header[len(prefix) :]).lower()
                extra.setdefault(key, []).append(value)
    return User(name=name, uid=uid, groups=groups, extra=extra)


class Authenticator:
    """Front-proxy certificate first, then bearer token (see the module docstring)."""

    def __init__(
        self, proxy: FrontProxy | None, api: KubeClient | None, *, token_ttl_s: float = 10.0
    ) -> None:
        self.proxy = proxy
        self._api = api
        self._ttl_s = token_ttl_s
        self._tokens: dict[str, tuple[float, User | None]] = {}
        """SHA-256 of a token → (expiry, who it is; None: refused). Never the token itself."""

    async def authenticate(
        self, cert: Mapping[str, Any] | None, headers: Any, token: str | None
    ) -> User:
        """:raises AuthFailure: nobody could be established."""
        if cert is not None and self.proxy is not None:
            cn = _common_name(cert)
            if self.proxy.allowed_names and cn not in self.proxy.allowed_names:
                raise AuthFailure(f"x509: subject with cn={cn} is not in the allowed list")
            return user_from_headers(self.proxy, headers)
        if token is not None and self._api is not None:
            user = await self._reviewed(token)
            if user is None:
                raise AuthFailure("invalid bearer token")
            return user
        raise AuthFailure("no client certificate from the front proxy and no bearer token")

    async def _reviewed(self, token: str) -> User | None:
        """Who the token is (TokenReview), remembered ``token_ttl_s`` as the delegating
        authenticator does; an unreachable API is never remembered."""
        assert self._api is not None
        key, now = hashlib.sha256(token.encode()).hexdigest(), time.monotonic()
        known = self._tokens.get(key)
        if known is not None and known[0] > now:
            return known[1]
        try:
            body = await self._api.request(
                "POST", TOKENREVIEWS.collection_path(), reviewer.token_review(token)
            )
        except errors.ApiError as e:
            raise AuthFailure(f"token review unavailable: {e}") from e
        found = reviewer.authenticated_user(body)
        user = None if found is None else User(
            name=found["username"], uid=str(found.get("uid") or ""),
            groups=tuple(found.get("groups") or ()), extra=dict(found.get("extra") or {}),
        )  # fmt: skip
        if len(self._tokens) >= 4096:
            self._tokens.clear()
        self._tokens[key] = (now + self._ttl_s, user)
        return user


class Attributes(msgspec.Struct, frozen=True, kw_only=True):
    """What a request does, as a SubjectAccessReview's ``resourceAttributes`` says it."""

    verb: str
    group: str
    version: str
    resource: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""


class Unavailable(Exception):
    """No decision could be had (503, fail closed)."""


class Authorizer:
    """SubjectAccessReview per request, decisions cached ``ttl_s``."""

    def __init__(self, api: KubeClient, *, ttl_s: float = 10.0, max_entries: int = 4096) -> None:
        self._api = api
        self._ttl_s = ttl_s
        self._max = max_entries
        self._cache: dict[bytes, tuple[float, bool, str]] = {}

    async def allowed(self, user: User, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, reason). :raises Unavailable: the API could not decide."""
        if "system:masters" in user.groups:
            return True, ""
        key = msgspec.json.encode((user, attrs))
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        spec: dict[str, Any] = {
            "user": user.name, "groups": list(user.groups),
            "resourceAttributes": msgspec.to_builtins(attrs),
        }  # fmt: skip
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = user.extra
        body = {"apiVersion": SUBJECTACCESSREVIEWS.api_version, "kind": "SubjectAccessReview",
                "spec": spec}  # fmt: skip
        with anyio.move_on_after(reviewer.TIMEOUT_S):
            try:
                answer = await self._api.request(
                    "POST", SUBJECTACCESSREVIEWS.collection_path(), body
                )
            except errors.ApiError as e:
                raise Unavailable(f"authorization unavailable: {e}") from e
            status = answer.get("status") or {}
            allowed = bool(status.get("allowed")) and not status.get("denied")
            reason = str(status.get("reason") or "")
            if len(self._cache) >= self._max:
                self._cache.clear()
            self._cache[key] = (now + self._ttl_s, allowed, reason)
            return allowed, reason
        raise Unavailable("authorization unavailable: the API did not answer")

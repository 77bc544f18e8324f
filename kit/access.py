"""Who may read the HTTPS endpoint: the authorization seam and its decision cache.

Scrapers expect what kube-rbac-proxy gives them: a bearer token, checked by the Kubernetes API
(TokenReview), then a SubjectAccessReview for the non-resource URL (``GET /metrics``). Where the
check happens differs per process (the worker asks the API itself; the agents, which hold no
Kubernetes rights, ask the worker over the bus), so the endpoint only knows an
:class:`Authorizer`. This module defines that seam, the :class:`Decision` it returns, and
:class:`CachedAuthorizer`, which keeps a Prometheus scraping every 15 s from turning into two API
calls per scrape per node.

Invariants: a token is never stored or logged, only its SHA-256 (with the path) as a cache key;
a decision that says "could not decide" (``unavailable``) is never cached, so the endpoint fails
closed for as long as the reviewer is unreachable and recovers at the first answer.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol

__all__ = [
    "ALLOWED",
    "NO_TOKEN",
    "Authorizer",
    "CachedAuthorizer",
    "Decision",
    "DecisionCache",
    "Verdict",
    "bearer_token",
]

Verdict = Literal["allowed", "unauthenticated", "forbidden", "unavailable"]
"""``unauthenticated``: no or an invalid token (401); ``forbidden``: a valid token whose user may
not read the path (403); ``unavailable``: nobody could decide (503, fail closed)."""

HTTP_STATUS: Final[dict[Verdict, int]] = {
    "allowed": 200,
    "unauthenticated": 401,
    "forbidden": 403,
    "unavailable": 503,
}


@dataclass(frozen=True)
class Decision:
    """One answer to "may the bearer of this token GET this path"; ``reason`` is for people."""

    verdict: Verdict
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.verdict == "allowed"

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.verdict]


ALLOWED: Final = Decision("allowed")
NO_TOKEN: Final = Decision("unauthenticated", "no bearer token")


class Authorizer(Protocol):
    """Decides whether the bearer of ``token`` (None: no ``Authorization`` header) may GET
    ``path``. Never raises for a refusal or an unreachable reviewer: that is a :class:`Decision`
    (``unavailable``), so the endpoint always has something to answer."""

    async def allowed(self, token: str | None, path: str) -> Decision: ...


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def cache_key(token: str, path: str) -> str:
    """What the cache remembers instead of the token: SHA-256 of the token and the path."""
    return hashlib.sha256(f"{path}\n{token}".encode()).hexdigest()


class DecisionCache:
    """Bounded, time-limited memory of decisions (pure: the caller says what time it is).

    Allowed decisions live ``allowed_ttl_s``, refusals ``denied_ttl_s`` (shorter: a binding just
    created should take effect soon); ``unavailable`` is never stored. Beyond ``max_entries`` the
    least recently used entry goes, so a flood of random tokens cannot grow memory.
    """

    def __init__(
        self, *, allowed_ttl_s: float = 60.0, denied_ttl_s: float = 10.0, max_entries: int = 4096
    ) -> None:
        self._ttl: dict[Verdict, float] = {
            "allowed": allowed_ttl_s,
            "unauthenticated": denied_ttl_s,
            "forbidden": denied_ttl_s,
        }
        self._max = max_entries
        self._entries: OrderedDict[str, tuple[float, Decision]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: str, now: float) -> Decision | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, decision = entry
        if now >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return decision

    def store(self, key: str, decision: Decision, now: float) -> None:
        ttl = self._ttl.get(decision.verdict)
        if ttl is None or ttl <= 0:
            return
        self._entries[key] = (now + ttl, decision)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)


class CachedAuthorizer:
    """An :class:`Authorizer` that asks ``inner`` only when :class:`DecisionCache` has no answer.

    A request without a token is refused here (401) without asking anyone.
    """

    def __init__(
        self,
        inner: Authorizer,
        cache: DecisionCache | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._cache = cache or DecisionCache()
        self._clock = clock

    async def allowed(self, token: str | None, path: str) -> Decision:
        if token is None:
            return NO_TOKEN
        key = cache_key(token, path)
        known = self._cache.lookup(key, self._clock())
        if known is not None:
            return known
        decision = await self._inner.allowed(token, path)
        self._cache.store(key, decision, self._clock())
        return decision

"""Access reviews over the bus: agents ask the worker, which alone holds Kubernetes rights.

The node agents' HTTPS endpoints check a scraper's bearer token as kube-rbac-proxy would
(TokenReview, then SubjectAccessReview for the path), but the agents have no Kubernetes
credentials by design. So an agent sends a :class:`ReviewRequest` on :data:`SUBJECT` (NATS
request/reply); one worker replica (queue group :data:`QUEUE`) reviews it with its own API
client and replies with a :class:`ReviewResponse`. The contract is in ``docs/bus.md``.

Invariants:

- the agent side fails closed: no connection, no responder, no answer within the timeout, an
  unreadable answer or one of another version all read as ``unavailable`` (503), never allowed;
- the worker side never dies of a request: a malformed one is answered ``unavailable``, and
  requests beyond its backlog are dropped (the agent times out: 503);
- the token travels only in the request (to the worker's subject, which only the worker may
  read) and is never logged.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import anyio
import msgspec

from bus import subjects
from bus.connection import Connection
from bus.errors import BusError
from kit.access import NO_TOKEN, Authorizer, Decision, Verdict

__all__ = [
    "QUEUE",
    "SUBJECT",
    "BusReviewer",
    "ReviewRequest",
    "ReviewResponse",
    "answer",
    "decision_from",
    "serve_reviews",
]

log = logging.getLogger(__name__)

SUBJECT: Final = subjects.REVIEW
QUEUE: Final = "gpustack-worker"
VERSION: Final = 1
REQUEST_TIMEOUT_S: Final = 5.0
"""How long an agent waits for the worker: under Prometheus' default 10 s scrape timeout."""
MAX_REQUEST_BYTES: Final = 64 * 1024
"""A projected ServiceAccount token is about 1 KiB; anything this large is not a request."""


class ReviewRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """May the bearer of ``token`` GET ``path`` on the asking agent's endpoint?"""

    v: int = VERSION
    token: str
    path: str
    """The route's path (``/metrics``, ``/monitor/snapshot``): a non-resource URL."""
    node: str = ""
    """The asking agent's node, for the worker's logs only (it changes no decision)."""


class ReviewResponse(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    v: int = VERSION
    verdict: Verdict
    """``allowed``, ``unauthenticated`` (401), ``forbidden`` (403) or ``unavailable`` (503)."""
    reason: str = ""


_encode = msgspec.json.Encoder().encode
_decode_request = msgspec.json.Decoder(ReviewRequest).decode
_decode_response = msgspec.json.Decoder(ReviewResponse).decode


def decision_from(payload: bytes) -> Decision:
    """What a worker's reply means to the agent (pure); anything odd is ``unavailable``."""
    try:
        response = _decode_response(payload)
    except msgspec.DecodeError:
        return Decision("unavailable", "authorization unavailable: unreadable answer")
    if response.v != VERSION:
        return Decision("unavailable", f"authorization unavailable: answer version {response.v}")
    return Decision(response.verdict, response.reason)


class BusReviewer:
    """The agents' :class:`~kit.access.Authorizer`: asks the worker over the bus.

    Usable before any connection (it answers ``unavailable`` until :meth:`attach`), so the
    endpoint starts at once and fails closed while NATS is away.
    """

    def __init__(self, node: str, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._node = node
        self._timeout_s = timeout_s
        self._conn: Connection | None = None

    @asynccontextmanager
    async def attach(self, conn: Connection) -> AsyncIterator[None]:
        """Ask through ``conn`` while inside."""
        self._conn = conn
        try:
            yield
        finally:
            self._conn = None

    async def allowed(self, token: str | None, path: str) -> Decision:
        if token is None:
            return NO_TOKEN
        if self._conn is None:
            return Decision("unavailable", "authorization unavailable: no bus connection")
        request = ReviewRequest(token=token, path=path, node=self._node)
        try:
            reply = await self._conn.request(SUBJECT, _encode(request), timeout_s=self._timeout_s)
        except BusError as e:
            return Decision("unavailable", f"authorization unavailable: {e}")
        return decision_from(reply)


async def answer(authorizer: Authorizer, payload: bytes) -> ReviewResponse:
    """The worker's reply to one request; never raises."""
    if len(payload) > MAX_REQUEST_BYTES:
        return ReviewResponse(verdict="unavailable", reason="review request too large")
    try:
        request = _decode_request(payload)
    except msgspec.DecodeError:
        return ReviewResponse(verdict="unavailable", reason="unreadable review request")
    if request.v != VERSION:
        return ReviewResponse(verdict="unavailable", reason=f"review version {request.v} unknown")
    try:
        decision = await authorizer.allowed(request.token, request.path)
    except Exception:  # a reviewer bug must cost one 503, not the worker
        log.exception("review of %s for node %s failed", request.path, request.node)
        return ReviewResponse(verdict="unavailable", reason="review failed")
    log.debug("review of %s for node %s: %s", request.path, request.node, decision.verdict)
    return ReviewResponse(verdict=decision.verdict, reason=decision.reason)


@asynccontextmanager
async def serve_reviews(
    conn: Connection, authorizer: Authorizer, *, concurrency: int = 16, backlog: int = 1024
) -> AsyncIterator[None]:
    """Answer review requests on :data:`SUBJECT` with ``authorizer`` while inside.

    Up to ``concurrency`` reviews run at once; up to ``backlog`` more wait. Every worker
    replica serves: the queue group hands each request to one of them.
    """
    send, receive = anyio.create_memory_object_stream[tuple[bytes, str]](backlog)

    def on_request(payload: bytes, reply: str) -> None:
        try:
            send.send_nowait((payload, reply))
        except anyio.WouldBlock:
            log.warning("review backlog full (%d): request dropped", backlog)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # shutting down: the agent times out and answers 503

    async def work() -> None:
        async for payload, reply in receive:
            response = await answer(authorizer, payload)
            if reply:
                try:
                    await conn.publish(reply, _encode(response))
                except BusError as e:
                    log.debug("cannot answer a review request: %s", e)

    with send, receive:
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(work, name="review")
            async with conn.serve_requests(SUBJECT, on_request, queue=QUEUE):
                yield
            tg.cancel_scope.cancel()

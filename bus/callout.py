"""The NATS auth callout: the server asks us who a connecting client is, we answer with its rights.

With ``authorization { auth_callout { … } }`` the server sends every connection attempt (except
the callout's own ``auth_users``) as an *authorization request* JWT, signed by the server, to
:data:`bus.identity.CALLOUT_SUBJECT`. The service (:func:`serve`, run by the worker):

1. decodes and checks the request (:func:`parse_request`), which carries the client's
   ``CONNECT`` credentials and a one-time user NKey;
2. asks a :data:`Verifier` who the credentials prove (a Kubernetes TokenReview in a cluster, a
   table of generated tokens in ``standalone``), which answers a :class:`Grant` or raises
   :class:`Refused`;
3. answers with an *authorization response* JWT, signed by the issuer account key the server
   is configured with, that carries a user JWT for that one-time key: the identity's
   permissions from :func:`bus.identity.permissions_for`, placed in :data:`ACCOUNT`. A refusal
   answers an error instead, which the server logs and turns into "Authorization Violation".

The user JWT carries no expiry: nats-py closes a connection for good (it does not reconnect)
when the server ends it with "User Authentication Expired", which would leave an agent off the
bus. A connection is therefore verified when it is made and at every reconnect (server
restarts, network loss): a credential revoked meanwhile keeps an established connection, never
gets a new one.

Nothing the client says decides its permissions: only the verifier's identity does. A request
that does not decode is not answered (the server times it out and refuses the client).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import msgspec
from anyio.abc import TaskStatus

from bus import identity, jwt
from bus.connection import Connection
from bus.errors import BusError, InvalidToken
from bus.identity import Identity

__all__ = [
    "ACCOUNT",
    "Credentials",
    "Grant",
    "Refused",
    "Request",
    "Verifier",
    "answer",
    "parse_request",
    "serve",
    "server_config",
    "token_table",
    "transport_allowed",
    "user_claims",
]

log = logging.getLogger(__name__)

ACCOUNT: Final = "GPUSTACK"
"""The NATS account every identity is placed in (JetStream enabled there)."""
QUEUE: Final = "gpustack-callout"
"""Worker replicas share the requests: any one of them answers."""


class Refused(BusError):
    """Raised by a verifier: the credentials prove no identity (the reason is logged only)."""


class Credentials(msgspec.Struct, frozen=True, kw_only=True):
    """What the client sent in ``CONNECT`` (never trusted: only the verifier interprets it)."""

    token: str | None = None
    user: str | None = None
    password: str | None = None
    client: str = ""
    """Client name and address, for logs."""
    kind: str = ""
    """``Client``, or ``Leafnode`` for another server's leaf connection (empty: not said)."""
    transport: str = ""
    """``nats`` (TCP), ``websocket`` or ``mqtt`` (empty: not said)."""


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    """A verified identity."""

    identity: Identity


Verifier = Callable[[Credentials], Awaitable[Grant]]
"""Who the credentials prove; raises :class:`Refused` (or any :class:`BusError`) if nobody."""


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """The parts of an authorization request the answer depends on."""

    user_nkey: str
    server_id: str
    credentials: Credentials


def parse_request(payload: bytes, *, issuer: str, now: float | None = None) -> Request:
    """Decode and check an authorization request for the callout whose issuer is ``issuer``.

    :raises InvalidToken: not a current request JWT signed by a server, or meant for another
        issuer, or without the one-time user key.
    """
    claims = jwt.decode(payload, issuer="server", now=now)
    body = claims.get("nats")
    if claims.get("aud") != "nats-authorization-request" or not isinstance(body, dict):
        raise InvalidToken("not an authorization request")
    if body.get("type", "authorization_request") != "authorization_request":
        raise InvalidToken("not an authorization request")
    if claims.get("sub") != issuer:
        raise InvalidToken("authorization request for another issuer")
    user_nkey, server = body.get("user_nkey"), body.get("server_id") or {}
    if not isinstance(user_nkey, str) or jwt.public_key_type(user_nkey) != "user":
        raise InvalidToken("authorization request without a user key")
    opts, info = body.get("connect_opts") or {}, body.get("client_info") or {}
    creds = Credentials(
        token=_text(opts.get("auth_token")),
        user=_text(opts.get("user")),
        password=_text(opts.get("pass")),
        client=f"{_text(opts.get('name')) or '?'}@{_text(info.get('host')) or '?'}",
        kind=_text(info.get("kind")) or "",
        transport=_text(info.get("type")) or "",
    )
    return Request(user_nkey=user_nkey, server_id=str(server.get("id") or ""), credentials=creds)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def transport_allowed(ident: Identity, credentials: Credentials) -> bool:
    """Whether ``ident`` may connect the way ``credentials`` came: TCP clients always,
    WebSocket clients only where the template says (dashboards), leaf nodes, MQTT and what the
    server did not name never.

    Decided here because the server does not apply a callout user JWT's
    ``allowed_connection_types`` (2.15: it registers the user without checking them).
    """
    if credentials.kind != "Client":
        return False
    perms = identity.permissions_for(ident)
    return credentials.transport == "nats" or (
        credentials.transport == "websocket" and perms.websocket
    )


def user_claims(grant: Grant, user_nkey: str) -> dict[str, Any]:
    """The claims of the user JWT for ``grant`` (pure: the permissions come from the template;
    no ``exp``, see the module docstring)."""
    nats = identity.jwt_permissions(identity.permissions_for(grant.identity))
    return {
        "sub": user_nkey,
        "aud": ACCOUNT,
        "name": grant.identity.label,
        "nats": {"type": "user", "version": 2, **nats},
    }


def _response(request: Request, **outcome: str) -> dict[str, Any]:
    return {
        "sub": request.user_nkey,
        "aud": request.server_id,
        "nats": {"type": "authorization_response", "version": 2, **outcome},
    }


async def answer(
    payload: bytes, *, issuer: jwt.NKey, verify: Verifier, now: float | None = None
) -> bytes | None:
    """The signed response to one authorization request; None when it is not one."""
    at = time.time() if now is None else now
    try:
        request = parse_request(payload, issuer=issuer.public_key, now=at)
    except InvalidToken as e:
        log.warning("ignoring a malformed authorization request: %s", e)
        return None
    try:
        grant = await verify(request.credentials)
        if not transport_allowed(grant.identity, request.credentials):
            how = f"{request.credentials.kind}/{request.credentials.transport}"
            raise Refused(f"{grant.identity.label} may not connect as {how}")
    except BusError as e:
        log.warning("refused bus connection from %s: %s", request.credentials.client, e)
        outcome = {"error": f"not authorized: {e}"}
    else:
        log.info("bus connection from %s is %s", request.credentials.client, grant.identity.label)
        user = jwt.encode(user_claims(grant, request.user_nkey), issuer, now=at)
        outcome = {"jwt": user}
    return jwt.encode(_response(request, **outcome), issuer, now=at).encode()


async def serve(
    conn: Connection,
    *,
    issuer: jwt.NKey,
    verify: Verifier,
    concurrency: int = 8,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer authorization requests on ``conn`` until cancelled (``started`` once subscribed).

    Requests are handed from the client's reader to ``concurrency`` answering tasks: a slow
    verification (an API round trip) never stalls the connection. Beyond what they can take the
    newest requests are dropped; the server refuses those clients, which retry.
    """
    send, receive = anyio.create_memory_object_stream[tuple[bytes, str]](concurrency * 16)

    def on_request(payload: bytes, reply: str) -> None:
        try:
            send.send_nowait((payload, reply))
        except anyio.WouldBlock:
            log.warning("authorization requests pile up: dropping one")

    async def answering() -> None:
        async for payload, reply in receive:
            response = await answer(payload, issuer=issuer, verify=verify)
            if response is not None and reply:
                try:
                    await conn.publish(reply, response)
                except BusError as e:
                    log.warning("cannot answer an authorization request: %s", e)

    with send, receive:
        async with (
            conn.serve_requests(identity.CALLOUT_SUBJECT, on_request, queue=QUEUE),
            anyio.create_task_group() as tg,
        ):
            for _ in range(concurrency):
                tg.start_soon(answering)
            await conn.flush()
            task_status.started()


def token_table(tokens: Mapping[str, Identity]) -> Verifier:
    """A verifier of generated tokens (``standalone``): each token proves one identity."""
    table = [(t.encode(), ident) for t, ident in tokens.items()]

    async def verify(credentials: Credentials) -> Grant:
        given = (credentials.token or "").encode()
        found = None
        for token, ident in table:  # every entry compared, in constant time each
            if hmac.compare_digest(token, given):
                found = ident
        if found is None:
            raise Refused("unknown token")
        return Grant(identity=found)

    return verify


def server_config(*, issuer: str, auth_user_nkey: str, timeout_s: float = 5.0) -> str:
    """The server configuration of the callout (``standalone``, tests): one JetStream account
    holding the worker, an NKey user that bypasses the callout, with the worker's permissions."""
    worker = identity.Identity(role="worker")
    user = {
        "nkey": auth_user_nkey,
        "permissions": identity.config_permissions(identity.permissions_for(worker)),
    }
    accounts = {ACCOUNT: {"jetstream": "enabled", "users": [user]}}
    authorization = {
        "timeout": timeout_s,
        "auth_callout": {"issuer": issuer, "account": ACCOUNT, "auth_users": [auth_user_nkey]},
    }
    return f"accounts: {json.dumps(accounts)}\nauthorization: {json.dumps(authorization)}\n"

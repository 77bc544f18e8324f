"""The permission templates (bus.identity) and the callout's decisions (bus.callout), no loop.

The real server enforcing them is ``test_bus_callout.py``; here each rule is checked on the
pure function, against NATS's own wildcard matching (:func:`bus.subjects.matches`).
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import callout, identity, jwt, kv, subjects
from bus.errors import InvalidNodeName, InvalidToken
from bus.identity import Identity, Permissions
from bus.state import HISTORY_STREAM, SAMPLES_STREAM, STATE_STREAM

AGENTS = kv.stream_of(kv.AGENTS_BUCKET)
STREAMS = (STATE_STREAM, SAMPLES_STREAM, HISTORY_STREAM, AGENTS)
ADMIN = [
    f"$JS.API.{verb}.{stream}"
    for stream in STREAMS
    for verb in ("STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE")
] + [
    f"$JS.API.CONSUMER.DELETE.{STATE_STREAM}.c1",
    f"$JS.API.CONSUMER.DURABLE.CREATE.{STATE_STREAM}.c1",
    f"$JS.API.STREAM.MSG.DELETE.{STATE_STREAM}",
    kv.subject_of(kv.AGENTS_BUCKET, "nms.gpu-a"),
    kv.subject_of(kv.LEDGER_BUCKET, "devices._.gpu-a"),
    "$JS.API.ACCOUNT.PURGE.GPUSTACK",
    "$JS.API.META.LEADER.STEPDOWN",
    identity.CALLOUT_SUBJECT,
]
NODES = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?", fullmatch=True)
DM = "device-manager"


def may_publish(p: Permissions, subject: str) -> bool:
    allowed = any(subjects.matches(a, subject) for a in p.pub_allow)
    return allowed and not any(subjects.matches(d, subject) for d in p.pub_deny)


def may_subscribe(p: Permissions, subject: str) -> bool:
    allowed = any(subjects.matches(a, subject) for a in p.sub_allow)
    return allowed and not any(subjects.matches(d, subject) for d in p.sub_deny)


def test_node_roles_need_a_node_and_the_others_have_none() -> None:
    with pytest.raises(ValueError, match="needs node"):
        Identity(role=DM)
    with pytest.raises(ValueError, match="has no node"):
        Identity(role="dashboard", node="gpu-a")
    with pytest.raises(InvalidNodeName):
        Identity(role=DM, node="gpu>a")


@given(NODES, NODES)
def test_a_node_publishes_its_own_kinds_and_never_another_nodes(a: str, b: str) -> None:
    perms = identity.permissions_for(Identity(role=DM, node=a))
    for kind in subjects.KINDS:
        mine = may_publish(perms, subjects.subject(a, kind))
        assert mine == (kind in identity.KINDS_BY_ROLE[DM])
        if a != b:
            assert not may_publish(perms, subjects.subject(b, kind))


def test_the_model_agent_publishes_models_only() -> None:
    perms = identity.permissions_for(Identity(role="model-manager", node="gpu-a"))
    allowed = [k for k in subjects.KINDS if may_publish(perms, subjects.subject("gpu-a", k))]
    assert allowed == ["models"]


@pytest.mark.parametrize(
    "ident",
    [
        Identity(role=DM, node="gpu-a"),
        Identity(role="model-manager", node="gpu-a"),
        Identity(role="dashboard"),
    ],
    ids=lambda i: i.role,
)
def test_only_the_worker_administers_streams_buckets_and_the_callout(ident: Identity) -> None:
    perms = identity.permissions_for(ident)
    assert [s for s in ADMIN if may_publish(perms, s)] == []
    assert not may_subscribe(perms, identity.CALLOUT_SUBJECT)
    assert not perms.allow_responses
    worker = identity.permissions_for(Identity(role="worker"))
    administered = [s for s in ADMIN if may_publish(worker, s)]
    assert f"$JS.API.STREAM.UPDATE.{STATE_STREAM}" in administered
    assert kv.subject_of(kv.AGENTS_BUCKET, "nms.gpu-a") in administered
    assert may_subscribe(worker, identity.CALLOUT_SUBJECT) and worker.allow_responses


def test_the_explicit_denials_hold_even_under_a_broad_allow() -> None:
    perms = identity.permissions_for(Identity(role="dashboard"))
    broad = Permissions(pub_allow=(">",), pub_deny=perms.pub_deny, sub_allow=(">",))
    assert [s for s in ADMIN if may_publish(broad, s)] == []


@given(NODES, NODES)
def test_every_identity_reads_only_its_own_inbox(a: str, b: str) -> None:
    idents = [Identity(role=DM, node=a), Identity(role="model-manager", node=a)]
    idents += [Identity(role=DM, node=b), Identity(role="worker"), Identity(role="dashboard")]
    for ident in idents:
        perms = identity.permissions_for(ident)
        for other in idents:
            reply = f"{identity.inbox_prefix(other)}.nuid123.4"
            assert may_subscribe(perms, reply) == (
                identity.inbox_prefix(other) == identity.inbox_prefix(ident)
            )


def test_inbox_prefixes_put_the_node_in_one_token() -> None:
    ident = Identity(role=DM, node="ip-10-0-0-1.ec2.internal")
    assert identity.inbox_prefix(ident) == "_INBOX.device-manager.ip-10-0-0-1%2Eec2%2Einternal"
    assert identity.inbox_prefix(Identity(role="worker")) == "_INBOX.worker"


def test_the_model_agent_gets_its_own_store_spec_and_the_artifacts_only() -> None:
    perms = identity.permissions_for(Identity(role="model-manager", node="gpu-a.x"))
    direct = f"$JS.API.DIRECT.GET.{AGENTS}."
    key = functools.partial(kv.subject_of, kv.AGENTS_BUCKET)
    assert may_publish(perms, direct + key(kv.nms_key("gpu-a.x")))
    assert not may_publish(perms, direct + key(kv.nms_key("gpu-b.x")))
    assert not may_publish(perms, f"$JS.API.DIRECT.GET.{AGENTS}")  # the key in the body
    create = f"$JS.API.CONSUMER.CREATE.{AGENTS}.c1."
    assert may_publish(perms, create + key("artifacts.>"))
    assert not may_publish(perms, create + key(">"))
    assert not may_publish(perms, create + key(kv.nms_key("gpu-b.x")))
    assert not may_publish(perms, f"$JS.API.CONSUMER.CREATE.{AGENTS}")


def test_the_device_agent_reads_its_own_allocation_history_only() -> None:
    perms = identity.permissions_for(Identity(role=DM, node="gpu-a"))
    create = f"$JS.API.CONSUMER.CREATE.{HISTORY_STREAM}.c1."
    assert may_publish(perms, create + subjects.subject("gpu-a", "allocations"))
    assert not may_publish(perms, create + subjects.subject("gpu-b", "allocations"))
    assert not may_publish(perms, create + "gpustack.v1.node.*.allocations")
    assert not may_publish(perms, f"$JS.API.CONSUMER.CREATE.{STATE_STREAM}.c1.>")


def test_the_device_agent_gets_its_own_pending_containers_only() -> None:
    perms = identity.permissions_for(Identity(role=DM, node="gpu-a.x"))
    direct = f"$JS.API.DIRECT.GET.{AGENTS}."
    key = functools.partial(kv.subject_of, kv.AGENTS_BUCKET)
    assert may_publish(perms, direct + key(kv.pending_key("gpu-a.x")))
    assert not may_publish(perms, direct + key(kv.pending_key("gpu-b.x")))
    assert not may_publish(perms, direct + key(kv.nms_key("gpu-a.x")))
    assert not may_publish(perms, f"$JS.API.DIRECT.GET.{AGENTS}")  # the key in the body
    assert not may_publish(perms, f"$JS.API.CONSUMER.CREATE.{AGENTS}.c1." + key(">"))


def test_the_dashboard_reads_every_node_and_writes_nothing() -> None:
    perms = identity.permissions_for(Identity(role="dashboard"))
    assert may_subscribe(perms, subjects.subject("gpu-a", "health"))
    assert not any(may_publish(perms, subjects.subject("gpu-a", k)) for k in subjects.KINDS)
    assert may_publish(perms, f"$JS.API.CONSUMER.CREATE.{STATE_STREAM}.c1.gpustack.v1.node.>")
    assert perms.websocket
    claims = identity.jwt_permissions(perms)
    assert claims["allowed_connection_types"] == ["STANDARD", "WEBSOCKET"]


def test_the_two_renderings_carry_the_same_lists() -> None:
    perms = identity.permissions_for(Identity(role=DM, node="gpu-a"))
    claims, config = identity.jwt_permissions(perms), identity.config_permissions(perms)
    assert (
        claims["pub"]
        == config["publish"]
        == {"allow": list(perms.pub_allow), "deny": list(perms.pub_deny)}
    )
    assert claims["sub"] == config["subscribe"]
    # -1 is "no limit" in a user JWT; 0 would forbid every subscription and payload.
    assert (claims["subs"], claims["data"], claims["payload"]) == (-1, -1, -1)
    assert claims["allowed_connection_types"] == ["STANDARD"] and "resp" not in claims
    worker = identity.permissions_for(Identity(role="worker"))
    assert identity.config_permissions(worker)["allow_responses"] is True


# --- the callout's decisions ---------------------------------------------------------------

ISSUER = jwt.NKey.generate("account")
SERVER = jwt.NKey.generate("server")


def _request(*, sub: str = ISSUER.public_key, token: str = "t", signer: jwt.NKey = SERVER,
             exp: int = 2000, user_nkey: str | None = None) -> bytes:  # fmt: skip
    claims = {
        "sub": sub,
        "aud": "nats-authorization-request",
        "exp": exp,
        "nats": {
            "type": "authorization_request",
            "server_id": {"id": SERVER.public_key, "name": "n0"},
            "user_nkey": user_nkey or jwt.NKey.generate("user").public_key,
            "client_info": {"host": "10.0.0.7", "kind": "Client", "type": "nats"},
            "connect_opts": {"auth_token": token, "name": "agent/gpu-a"},
        },
    }
    return jwt.encode(claims, signer, now=1000).encode()


def test_a_request_yields_the_credentials_and_the_keys_to_answer_for() -> None:
    req = callout.parse_request(_request(token="sa-token"), issuer=ISSUER.public_key, now=1500)
    assert req.credentials.token == "sa-token" and req.credentials.password is None
    assert req.credentials.client == "agent/gpu-a@10.0.0.7"
    assert (req.credentials.kind, req.credentials.transport) == ("Client", "nats")
    assert req.server_id == SERVER.public_key and req.user_nkey.startswith("U")


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (_request(signer=jwt.NKey.generate("account")), "account key, expected a server key"),
        (_request(sub=jwt.NKey.generate("account").public_key), "another issuer"),
        (_request(exp=1200), "expired"),
        (_request(user_nkey=ISSUER.public_key), "without a user key"),
        (b"garbage", "not a JWT"),
    ],
)
def test_a_request_that_is_not_for_us_is_refused(payload: bytes, why: str) -> None:
    with pytest.raises(InvalidToken, match=why):
        callout.parse_request(payload, issuer=ISSUER.public_key, now=1500)


def test_the_user_jwt_carries_the_template_and_no_expiry() -> None:
    grant = callout.Grant(identity=Identity(role=DM, node="gpu-a"))
    claims = callout.user_claims(grant, "UKEY")
    assert claims["sub"] == "UKEY" and claims["aud"] == callout.ACCOUNT
    assert claims["name"] == "device-manager/gpu-a"
    perms = identity.permissions_for(grant.identity)
    assert claims["nats"]["pub"]["allow"] == list(perms.pub_allow)
    # nats-py would close, not reconnect, a connection whose JWT expired (bus/callout.py).
    assert "exp" not in claims


@pytest.mark.anyio
async def test_answers_are_signed_for_the_one_time_key_and_say_yes_or_why_not() -> None:
    user = jwt.NKey.generate("user").public_key
    verify = callout.token_table({"good": Identity(role=DM, node="gpu-a")})
    yes = await callout.answer(_request(token="good", user_nkey=user), issuer=ISSUER,
                               verify=verify, now=1500)  # fmt: skip
    no = await callout.answer(_request(token="bad", user_nkey=user), issuer=ISSUER,
                              verify=verify, now=1500)  # fmt: skip
    assert yes is not None and no is not None
    granted = jwt.decode(yes, issuer="account", now=1500)
    assert (granted["sub"], granted["aud"]) == (user, SERVER.public_key)
    inner = jwt.decode(granted["nats"]["jwt"], issuer="account", now=1500)
    assert inner["sub"] == user and inner["name"] == "device-manager/gpu-a"
    refused = jwt.decode(no, now=1500)["nats"]
    assert "jwt" not in refused and refused["error"] == "not authorized: unknown token"
    assert await callout.answer(b"garbage", issuer=ISSUER, verify=verify) is None


@pytest.mark.parametrize(
    ("role", "kind", "transport", "allowed"),
    [
        (DM, "Client", "nats", True),
        (DM, "Client", "websocket", False),
        ("dashboard", "Client", "websocket", True),
        ("dashboard", "Client", "mqtt", False),
        ("dashboard", "Leafnode", "nats", False),
        ("worker", "Client", "websocket", False),
        (DM, "", "", False),  # a request that does not say how the client came
    ],
)
def test_only_dashboards_come_over_websocket_and_nobody_as_a_leaf(
    role: identity.Role, kind: str, transport: str, allowed: bool
) -> None:
    ident = Identity(role=role, node="gpu-a" if role == DM else None)
    creds = callout.Credentials(kind=kind, transport=transport)
    assert callout.transport_allowed(ident, creds) is allowed


def test_node_agents_may_ask_for_reviews_and_only_the_worker_reads_them() -> None:
    from bus import identity as ids
    from bus import subjects as subj

    worker = ids.permissions_for(ids.Identity(role="worker"))
    assert subj.REVIEW in worker.sub_allow and worker.allow_responses
    for role in ("device-manager", "model-manager"):
        agent = ids.permissions_for(ids.Identity(role=role, node="gpu-a.example"))
        assert subj.REVIEW in agent.pub_allow
        assert subj.REVIEW not in agent.sub_allow
    dashboard = ids.permissions_for(ids.Identity(role="dashboard"))
    assert subj.REVIEW not in (*dashboard.pub_allow, *dashboard.sub_allow)

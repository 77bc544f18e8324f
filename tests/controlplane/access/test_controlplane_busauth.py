"""Bus identities proven by Kubernetes: TokenReview decisions, and the worker serving the callout.

The pure decision first (no loop), then TokenReview through the real Kubernetes client against
the stateful fake API over HTTP, with a real nats-server enforcing what the callout answers, and
last the whole worker serving the callout as deployed.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node

from bus import callout, codec, connection, embedded, errors, events, jwt, state, subjects, testing
from bus.identity import Identity
from bus.testing import eventually, settings_for
from controlplane.access import busauth
from controlplane.k8s import client
from controlplane.k8s.client import KubeSettings
from controlplane.worker import leading, running
from kit.serving import HttpsSettings

NS = "gpustack-system"
DM_SA = "gpustack-operator-device-manager"
AUTH = busauth.BusAuthSettings(issuer_seed_file="unused", namespace=NS)
A = Identity(role="device-manager", node="gpu-a.example")


def _review(username: str, *, node: str | None = "gpu-a", pod: str | None = "dm-x7k2p",
            audiences: list[str] | None = None, authenticated: bool = True) -> dict[str, Any]:  # fmt: skip
    extra = {}
    if node is not None:
        extra["authentication.kubernetes.io/node-name"] = [node]
    if pod is not None:
        extra["authentication.kubernetes.io/pod-name"] = [pod]
    user = {"username": username, "extra": extra}
    aud = ["gpustack-nats"] if audiences is None else audiences
    return {"status": {"authenticated": authenticated, "audiences": aud, "user": user}}


def _sa(name: str, ns: str = NS) -> str:
    return f"system:serviceaccount:{ns}:{name}"


def test_a_pod_bound_agent_token_proves_the_agent_of_its_pods_node() -> None:
    ident = busauth.identity_from_review(_review(_sa(DM_SA)), AUTH)
    assert (ident.role, ident.node) == ("device-manager", "gpu-a")
    assert ident.name == f"{_sa(DM_SA)} pod dm-x7k2p"
    mm = busauth.identity_from_review(_review(_sa("gpustack-operator-model-manager")), AUTH)
    assert (mm.role, mm.node) == ("model-manager", "gpu-a")
    dash = busauth.identity_from_review(
        _review(_sa("gpustack-operator-dashboard"), node=None, pod=None), AUTH
    )
    assert (dash.role, dash.node) == ("dashboard", None)
    # The worker connects as its static user, and the worker-gateway never connects: their
    # ServiceAccounts' tokens prove no role on the bus.
    for account in ("gpustack-operator-worker", "gpustack-operator-worker-gateway"):
        with pytest.raises(callout.Refused, match="has no role"):
            busauth.identity_from_review(_review(_sa(account), node=None, pod=None), AUTH)


@pytest.mark.parametrize(
    ("review", "why"),
    [
        (_review(_sa(DM_SA), authenticated=False), "not authenticated"),
        (_review(_sa(DM_SA), audiences=[]), "audience"),  # valid for the API server only
        (_review(_sa(DM_SA), audiences=["https://kubernetes.default.svc"]), "audience"),
        (_review(_sa(DM_SA, ns="tenant")), "not a ServiceAccount of gpustack-system"),
        (_review("system:node:gpu-a"), "not a ServiceAccount"),
        (_review(_sa("default")), "no role on the bus"),
        (_review(_sa(DM_SA), node=None), "not bound to a Pod on a node"),
        (_review(_sa(DM_SA), pod=None), "not bound to a Pod on a node"),
        (_review(_sa(DM_SA), node="gpu>a"), "node 'gpu>a'"),
        ({}, "not authenticated"),
    ],
)
def test_what_proves_no_identity(review: dict[str, Any], why: str) -> None:
    with pytest.raises(callout.Refused, match=why):
        busauth.identity_from_review(review, AUTH)


def test_the_expiry_is_read_from_the_tokens_claims() -> None:
    claims = base64.urlsafe_b64encode(json.dumps({"exp": 1234}).encode()).decode().rstrip("=")
    assert busauth.token_expiry(f"h.{claims}.s") == 1234.0
    assert busauth.token_expiry("opaque") is None
    assert busauth.token_expiry("h.!!!.s") is None
    assert busauth.token_expiry("h.e30.s") is None  # "{}"


def test_the_issuer_must_be_an_account_seed(tmp_path: Path) -> None:
    account, user = jwt.NKey.generate("account"), jwt.NKey.generate("user")
    (tmp_path / "a").write_text(account.seed + "\n")
    (tmp_path / "u").write_text(user.seed)
    (tmp_path / "g").write_text("garbage")
    assert busauth.load_issuer(str(tmp_path / "a")).public_key == account.public_key
    with pytest.raises(errors.InvalidToken, match="a user seed"):
        busauth.load_issuer(str(tmp_path / "u"))
    with pytest.raises(errors.InvalidToken, match=f"{tmp_path / 'g'}: not an NKey seed"):
        busauth.load_issuer(str(tmp_path / "g"))


# --- TokenReview over HTTP, a real server enforcing the answers -----------------------------


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[FakeApi, testing.CalloutBus]]:
    async with (
        fake_api() as (fake, url),
        client.open_client(KubeSettings.for_tests(url, backoff_s=0.01)) as api,
        testing.callout_server(tmp_path, busauth.review_verifier(api, AUTH)) as bus,
    ):
        async with connection.connect(bus.worker, retry=False) as conn:
            await state.ensure_streams(conn, bus.worker)
        yield fake, bus


async def _publish(settings: object, node: str, kind: str = "devices") -> None:
    event = next(e for e in testing.example_events(node) if events.kind_of(e) == kind)
    async with connection.connect(settings, retry=False) as conn:  # type: ignore[arg-type]
        await conn.publish_acked(subjects.subject(node, kind), codec.encode(event))


@pytest.mark.anyio
async def test_an_agent_publishes_as_the_node_its_token_is_bound_to(
    cluster: tuple[FakeApi, testing.CalloutBus],
) -> None:
    fake, bus = cluster
    token = fake.issue_token(NS, DM_SA, node="gpu-a.example")
    await _publish(bus.settings_as(A, token), "gpu-a.example")
    # Whatever inbox or name it claims, its token says gpu-a: gpu-b is not its to publish.
    posing = bus.settings_as(Identity(role="device-manager", node="gpu-b.example"), token)
    with pytest.raises(errors.PublishFailed):
        await _publish(posing, "gpu-b.example")
    with pytest.raises(errors.PublishFailed):
        await _publish(bus.settings_as(A, token), "gpu-b.example")
    assert fake.reviews["TokenReview"] >= 3


@pytest.mark.anyio
@pytest.mark.parametrize(
    "issue",
    [
        lambda f: f.issue_token(NS, DM_SA, node="gpu-a.example", audiences=("other",)),
        lambda f: f.issue_token("tenant", DM_SA, node="gpu-a.example"),
        lambda f: f.issue_token(NS, DM_SA),  # not bound to a Pod
        lambda f: f.issue_token(NS, "default", node="gpu-a.example"),
        lambda f: "eyJ.forged.token",
    ],
    ids=["audience", "namespace", "unbound", "service-account", "unknown"],
)
async def test_a_token_that_proves_no_agent_is_refused(
    cluster: tuple[FakeApi, testing.CalloutBus], issue: Any
) -> None:
    fake, bus = cluster
    with pytest.raises(errors.NotConnected):
        await _publish(bus.settings_as(A, issue(fake)), "gpu-a.example")


@pytest.mark.anyio
async def test_a_revoked_token_no_longer_connects(
    cluster: tuple[FakeApi, testing.CalloutBus],
) -> None:
    fake, bus = cluster
    token = fake.issue_token(NS, DM_SA, node="gpu-a.example")
    await _publish(bus.settings_as(A, token), "gpu-a.example")
    fake.revoke(token)  # the agent's Pod was deleted
    with pytest.raises(errors.NotConnected):
        await _publish(bus.settings_as(A, token), "gpu-a.example")


@pytest.mark.anyio
async def test_an_expired_or_misshapen_token_costs_no_review(
    cluster: tuple[FakeApi, testing.CalloutBus],
) -> None:
    fake, bus = cluster
    expired = fake.issue_token(NS, DM_SA, node="gpu-a.example", ttl_s=-1.0)
    for token in (expired, "not-a-jwt", "a.b.c"):
        with pytest.raises(errors.NotConnected):
            await _publish(bus.settings_as(A, token), "gpu-a.example")
    assert not fake.reviews


# --- the whole worker, serving the callout as deployed --------------------------------------


@pytest.mark.anyio
async def test_the_worker_serves_the_callout_and_ingests_what_agents_publish(
    tmp_path: Path,
) -> None:
    issuer, worker_key = jwt.NKey.generate("account"), jwt.NKey.generate("user")
    (tmp_path / "issuer.nk").write_text(issuer.seed)
    (tmp_path / "worker.nk").write_text(worker_key.seed)
    config = callout.server_config(issuer=issuer.public_key, auth_user_nkey=worker_key.public_key)
    async with (
        embedded.embedded_server(tmp_path / "nats", extra_config=config) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        fake.put_object("api/v1/nodes", node("gpu-a.example"))
        bus = settings_for(
            server, nkey_seed_file=str(tmp_path / "worker.nk"), inbox_prefix="_INBOX.worker"
        )
        settings = running.WorkerSettings(
            concurrency=16,
            bus=bus,
            kube=KubeSettings.for_tests(url, backoff_s=0.01),
            https=HttpsSettings(bind_address="127.0.0.1", port=0),
            leader=leading.LeaderSettings(name="w", namespace=NS, lease_s=1.0, renew_timeout_s=0.6),
            bus_auth=msgspec.structs.replace(AUTH, issuer_seed_file=str(tmp_path / "issuer.nk")),
        )
        await tg.start(running.run, settings)
        token = fake.issue_token(NS, DM_SA, node="gpu-a.example")
        agent = msgspec.structs.replace(
            settings_for(server), token=token, inbox_prefix="_INBOX.device-manager.gpu-a%2Eexample"
        )
        await _publish(agent, "gpu-a.example")

        async def devices_written() -> bool:
            key = ("apis/worker.gpustack.ai/v1alpha1/devices", None, "gpu-a.example")
            return key in fake.objects

        await eventually(devices_written)
        with pytest.raises(errors.NotConnected):
            await _publish(msgspec.structs.replace(agent, token="nope"), "gpu-a.example")
        tg.cancel_scope.cancel()

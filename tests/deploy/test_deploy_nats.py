"""The built NATS configuration, run by a real ``nats-server``.

The cluster block cannot form on loopback, so each test runs one server with the built
``auth.conf`` (exactly as shipped), the auth callout served on the worker's connection as the
worker serves it, and checks what each identity may and may not do through the real bus code;
the full ``nats.conf`` of every tree is checked by ``nats-server -t``.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from deploy_helpers import BASE, INSTALLS, build, find, pod_spec, workloads

from bus import (
    callout,
    codec,
    connection,
    errors,
    events,
    identity,
    jwt,
    publishing,
    state,
    subjects,
    testing,
)
from bus.embedded import ServerProcess, find_binary
from bus.identity import Identity
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from controlplane.access import busauth

pytestmark = pytest.mark.anyio

WORKER_PASSWORD = "w0rker-Secret_1"
ISSUER = jwt.NKey.generate("account")
ENV = {"NATS_WORKER_PASSWORD": WORKER_PASSWORD, "NATS_CALLOUT_ISSUER": ISSUER.public_key}
A = Identity(role="device-manager", node="gpu-a.example")
IDENTITIES = {
    "device-manager": A,
    "device-manager-b": Identity(role="device-manager", node="gpu-b.example"),
    "model-manager": Identity(role="model-manager", node="gpu-a.example"),
    "dashboard": Identity(role="dashboard"),
}
TOKENS = {f"token-{name}": ident for name, ident in IDENTITIES.items()}


def _config(tree: str) -> dict[str, str]:
    data: dict[str, str] = find(build(tree), "ConfigMap", "gpustack-nats-config")["data"]
    return data


@pytest.mark.parametrize("tree", INSTALLS)
def test_nats_server_accepts_the_built_configuration(tree: str, tmp_path: Path) -> None:
    for name, text in _config(tree).items():
        # The WebSocket TLS files come from a Secret in the cluster; the server loads them.
        (tmp_path / name).write_text(text.replace("/etc/nats-websocket-tls/", f"{tmp_path}/"))
    _self_signed(tmp_path)
    done = subprocess.run(
        [find_binary(), "-t", "-c", str(tmp_path / "nats.conf")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, **ENV, "SERVER_NAME": "gpustack-nats-0"},
    )
    assert done.returncode == 0, done.stderr + done.stdout


def _self_signed(where: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpustack-nats")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (where / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (where / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class _AuthServer(ServerProcess):
    """One server: the harness's listener and JetStream, plus the built ``auth.conf``."""

    auth: str = ""

    def _config(self) -> str:
        (self.store_dir / "auth.conf").write_text(self.auth)
        return super()._config() + 'include "auth.conf"\n'


@pytest.fixture
async def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ServerProcess]:
    """The built auth.conf on a real server, and the callout served on the worker's connection
    (as the worker serves it; which token proves whom is controlplane/access/busauth.py's business)."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)  # the server process inherits them
    proc = _AuthServer(tmp_path / "nats")
    proc.auth = _config(BASE)["auth.conf"]
    try:
        await proc.start()
        worker = _as(proc, "worker")
        async with (
            connection.connect(worker, retry=False) as conn,
            anyio.create_task_group() as tg,
        ):
            await state.ensure_streams(conn, worker)
            verify = callout.token_table(TOKENS)
            await tg.start(lambda task_status: callout.serve(
                conn, issuer=ISSUER, verify=verify, task_status=task_status
            ))  # fmt: skip
            yield proc
            tg.cancel_scope.cancel()
    finally:
        await proc.stop()


def _as(server: ServerProcess, who: str, **overrides: Any) -> BusSettings:
    if who == "worker":
        return testing.settings_for(
            server, user="worker", password=WORKER_PASSWORD, inbox_prefix="_INBOX.worker",
            **overrides,
        )  # fmt: skip
    ident = IDENTITIES[who]
    return testing.settings_for(
        server, token=f"token-{who}", inbox_prefix=identity.inbox_prefix(ident), **overrides
    )


async def _publish_all(settings: BusSettings, node: str, kinds: set[str]) -> None:
    async with (
        connection.connect(settings, retry=False) as conn,
        publishing.publisher(
            conn, settings=settings, metrics=BusMetrics(), ensure_streams=False
        ) as pub,
    ):
        for event in testing.example_events(node):
            if events.kind_of(event) in kinds:
                pub.publish(event)
        with anyio.fail_after(10):
            await pub.wait_sent()


async def _refused(settings: BusSettings, node: str, kind: str) -> bool:
    event = next(e for e in testing.example_events(node) if events.kind_of(e) == kind)
    async with connection.connect(settings, retry=False) as conn:
        try:
            await conn.publish_acked(
                subjects.subject(node, events.kind_of(event)), codec.encode(event)
            )
        except errors.PublishFailed:
            return True
    return False


async def _state(settings: BusSettings) -> set[tuple[str, str]]:
    """(node, kind) of every retained event, read as a late subscriber reads it."""
    async with connection.connect(settings, retry=False) as conn:
        retained = await state.snapshot(conn, settings, node=None, kind=None)
    return {subjects.parse(subj) for subj, _ in retained}


DM_KINDS = {"devices", "samples", "health", "allocations", "agent"}


async def test_agents_publish_their_kinds_and_the_worker_reads_them(
    server: ServerProcess,
) -> None:
    await _publish_all(_as(server, "device-manager"), "gpu-a.example", DM_KINDS)
    await _publish_all(_as(server, "model-manager"), "gpu-a.example", {"models"})
    seen = await _state(_as(server, "worker"))
    assert seen == {("gpu-a.example", k) for k in DM_KINDS | {"models"}}


async def test_dashboard_reads_state_but_never_publishes(server: ServerProcess) -> None:
    await _publish_all(_as(server, "device-manager"), "gpu-a.example", {"devices"})
    assert await _state(_as(server, "dashboard")) == {("gpu-a.example", "devices")}
    assert await _refused(_as(server, "dashboard"), "gpu-a.example", "devices")


@pytest.mark.parametrize(
    ("who", "node", "kind"),
    [
        ("device-manager", "gpu-a.example", "models"),
        ("model-manager", "gpu-a.example", "devices"),
        ("worker", "gpu-a.example", "health"),
        # The hostile tester's forgery: node B's devices and health with node A's credential.
        ("device-manager", "gpu-b.example", "devices"),
        ("device-manager", "gpu-b.example", "health"),
        ("model-manager", "gpu-b.example", "models"),
    ],
)
async def test_nobody_publishes_what_is_not_theirs(
    server: ServerProcess, who: str, node: str, kind: str
) -> None:
    assert await _refused(_as(server, who), node, kind)
    assert (node, kind) not in await _state(_as(server, "worker"))


async def test_an_agent_can_neither_shrink_the_state_stream_nor_read_others_replies(
    server: ServerProcess,
) -> None:
    shrink = msgspec.json.encode(
        {"name": state.STATE_STREAM, "subjects": ["gpustack.v1.node.*.devices"], "max_msgs": 1}
    )
    stolen: list[str] = []
    async with connection.connect(_as(server, "device-manager"), retry=False) as spy:
        async with spy.subscribe("_INBOX.>", lambda s, _d: stolen.append(s)):
            await spy.publish(
                f"$JS.API.STREAM.UPDATE.{state.STATE_STREAM}", shrink, reply=spy.new_inbox()
            )
            await spy.flush()
            await _publish_all(_as(server, "device-manager-b"), "gpu-b.example", {"devices"})
        await _publish_all(_as(server, "device-manager"), "gpu-a.example", {"devices", "agent"})
    assert stolen == []
    assert await _state(_as(server, "worker")) == {
        ("gpu-b.example", "devices"),
        ("gpu-a.example", "devices"),
        ("gpu-a.example", "agent"),
    }


@pytest.mark.parametrize(
    "overrides",
    [
        {"password": "guess"},
        {"user": None, "password": None},
        {"user": None, "password": None, "token": "guess"},
    ],
)
async def test_wrong_or_missing_credentials_are_refused(
    server: ServerProcess, overrides: dict[str, Any]
) -> None:
    settings = msgspec.structs.replace(_as(server, "worker"), **overrides)
    with pytest.raises(errors.BusError):
        async with connection.connect(settings, retry=False):
            pass


def _quoted(block: str) -> list[str]:
    return re.findall(r'"([^"]+)"', block)


def test_the_workers_permissions_are_the_template() -> None:
    auth = _config(BASE)["auth.conf"]
    publish = re.search(r"publish: \{ allow: \[(.*?)\] \}", auth, re.DOTALL)
    subscribe = re.search(r"subscribe: \{ allow: \[(.*?)\] \}", auth, re.DOTALL)
    assert publish is not None and subscribe is not None
    worker = identity.permissions_for(Identity(role="worker"))
    assert _quoted(publish.group(1)) == list(worker.pub_allow)
    assert _quoted(subscribe.group(1)) == list(worker.sub_allow)
    assert "allow_responses: true" in auth and worker.allow_responses


def test_only_the_dashboard_may_use_websocket() -> None:
    auth = _config(BASE)["auth.conf"]
    assert auth.count("allowed_connection_types:") == 1  # the worker's; the callout's are JWTs
    assert 'allowed_connection_types: ["STANDARD"]' in auth
    for ident in [*IDENTITIES.values(), Identity(role="worker")]:
        websocket = identity.permissions_for(ident).websocket
        assert websocket == (ident.role == "dashboard"), ident.role


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("tree", INSTALLS)
def test_agents_prove_their_node_with_a_bus_only_token(tree: str) -> None:
    """Each agent presents its Pod's projected ServiceAccount token, for the callout's
    audience only (no API rights), and runs as a ServiceAccount the callout gives its role."""
    objs = build(tree)
    agents = [o for o in workloads(objs) if o["kind"] == "DaemonSet"]
    assert len(agents) == 10  # a device agent per manufacturer, and the model cache
    for obj in agents:
        spec = pod_spec(obj)
        role = busauth.ROLES_BY_SERVICE_ACCOUNT[spec["serviceAccountName"]]
        assert role == obj["metadata"]["labels"]["app.kubernetes.io/component"]
        find(objs, "ServiceAccount", spec["serviceAccountName"])
        (volume,) = [v for v in spec["volumes"] if "projected" in v]
        (source,) = volume["projected"]["sources"]
        token = source["serviceAccountToken"]
        assert token["audience"] == busauth.DEFAULT_AUDIENCE
        assert 600 <= token["expirationSeconds"] <= 3600
        agent = spec["containers"][0]
        (mount,) = [m for m in agent["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
        env = _env(agent)
        assert env["GPUSTACK_NATS_TOKEN_FILE"]["value"] == f"{mount['mountPath']}/{token['path']}"
        assert "GPUSTACK_NATS_PASSWORD" not in env and "GPUSTACK_NATS_USER" not in env
    find(objs, "ServiceAccount", "gpustack-operator-dashboard")


def test_the_worker_signs_with_the_key_the_servers_name_as_issuer() -> None:
    objs = build(BASE)
    spec = pod_spec(find(objs, "Deployment", "gpustack-operator-worker"))
    env = _env(spec["containers"][0])
    # The worker generates the Secret and reads it through the API: nothing of it is mounted
    # into the worker (it does not exist before the worker's first start).
    assert env["GPUSTACK_NATS_AUTH_SECRET"]["value"] == "gpustack-nats-auth"
    assert "GPUSTACK_NATS_CALLOUT_ISSUER_SEED" not in env and "GPUSTACK_NATS_PASSWORD" not in env
    assert not [v for v in spec["volumes"] if "secret" in v]
    nats = pod_spec(find(objs, "StatefulSet", "gpustack-nats"))["containers"][0]
    issuer = _env(nats)["NATS_CALLOUT_ISSUER"]["valueFrom"]["secretKeyRef"]
    assert issuer == {"name": "gpustack-nats-auth", "key": "callout-issuer"}
    password = _env(nats)["NATS_WORKER_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password == {"name": "gpustack-nats-auth", "key": "worker-password"}
    assert "issuer: $NATS_CALLOUT_ISSUER" in _config(BASE)["auth.conf"]

"""The built NATS configuration, run by a real ``nats-server``.

The cluster block cannot form on loopback, so each test runs one server with the built
``auth.conf`` (exactly as shipped) and checks what each component's user may and may not do
through the real bus code; the full ``nats.conf`` of every tree is checked by ``nats-server -t``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from deploy_helpers import BASE, INSTALLS, build, find

from bus import codec, connection, errors, events, publishing, reviewing, state, subjects, testing
from bus.embedded import ServerProcess, find_binary
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from kit.access import Decision

pytestmark = pytest.mark.anyio

PASSWORDS = {
    "NATS_WORKER_PASSWORD": "w0rker-Secret_1",
    "NATS_DEVICE_MANAGER_PASSWORD": "dm-Secret_2",
    "NATS_MODEL_MANAGER_PASSWORD": "mm-Secret_3",
    "NATS_DASHBOARD_PASSWORD": "dash-Secret_4",
}
USERS = {
    "worker": "NATS_WORKER_PASSWORD",
    "device-manager": "NATS_DEVICE_MANAGER_PASSWORD",
    "model-manager": "NATS_MODEL_MANAGER_PASSWORD",
    "dashboard": "NATS_DASHBOARD_PASSWORD",
}


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
        env={**os.environ, **PASSWORDS, "SERVER_NAME": "gpustack-nats-0"},
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
    for name, value in PASSWORDS.items():
        monkeypatch.setenv(name, value)  # the server process inherits them
    proc = _AuthServer(tmp_path / "nats")
    proc.auth = _config(BASE)["auth.conf"]
    try:
        await proc.start()
        yield proc
    finally:
        await proc.stop()


def _as(server: ServerProcess, user: str, **overrides: Any) -> BusSettings:
    return testing.settings_for(server, user=user, password=PASSWORDS[USERS[user]], **overrides)


async def _publish_all(settings: BusSettings, node: str, kinds: set[str]) -> None:
    async with (
        connection.connect(settings, retry=False) as conn,
        publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
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
    await _publish_all(_as(server, "device-manager"), "gpu-1.example", DM_KINDS)
    await _publish_all(_as(server, "model-manager"), "gpu-1.example", {"models"})
    seen = await _state(_as(server, "worker"))
    assert seen == {("gpu-1.example", k) for k in DM_KINDS | {"models"}}


async def test_dashboard_reads_state_but_never_publishes(server: ServerProcess) -> None:
    await _publish_all(_as(server, "device-manager"), "n1", {"devices"})
    assert await _state(_as(server, "dashboard")) == {("n1", "devices")}
    assert await _refused(_as(server, "dashboard"), "n1", "devices")


@pytest.mark.parametrize(
    ("user", "kind"),
    [("device-manager", "models"), ("model-manager", "devices"), ("worker", "health")],
)
async def test_a_component_cannot_publish_another_components_kind(
    server: ServerProcess, user: str, kind: str
) -> None:
    # The streams exist (an agent created them); only the subject permission stands in the way.
    await _publish_all(_as(server, "device-manager"), "n1", {"agent"})
    assert await _refused(_as(server, user), "n1", kind)


class _AllowAll:
    async def allowed(self, token: str | None, path: str) -> Decision:
        return Decision("allowed")


async def _review_as(server: ServerProcess, user: str) -> str:
    """What an access review asked as ``user`` comes back as."""
    reviewer = reviewing.BusReviewer("n1", timeout_s=1.0)
    async with connection.connect(_as(server, user), retry=False) as conn, reviewer.attach(conn):
        return (await reviewer.allowed("a-token", "/metrics")).verdict


async def test_only_the_worker_reads_reviews_and_only_agents_ask(server: ServerProcess) -> None:
    overheard: list[tuple[str, bytes]] = []
    async with AsyncExitStack() as stack:
        # Requests carry bearer tokens: nobody but the worker may subscribe to them (each
        # eavesdropper in a queue group of its own would get a copy of every request).
        for user in ("device-manager", "model-manager", "dashboard"):
            conn = await stack.enter_async_context(connection.connect(_as(server, user)))
            await stack.enter_async_context(
                conn.serve_requests(
                    reviewing.SUBJECT,
                    lambda data, _, u=user: overheard.append((u, data)),
                    queue=user,
                )
            )
        worker = await stack.enter_async_context(connection.connect(_as(server, "worker")))
        await stack.enter_async_context(reviewing.serve_reviews(worker, _AllowAll()))
        assert await _review_as(server, "device-manager") == "allowed"
        assert await _review_as(server, "model-manager") == "allowed"
        assert await _review_as(server, "dashboard") == "unavailable"  # may not publish it
    assert overheard == []


async def test_a_wrong_password_is_refused(server: ServerProcess) -> None:
    settings = msgspec.structs.replace(_as(server, "worker"), password="guess")
    with pytest.raises(errors.BusError):
        async with connection.connect(settings, retry=False):
            pass


def test_only_the_dashboard_may_use_websocket() -> None:
    auth = _config(BASE)["auth.conf"]
    assert auth.count('allowed_connection_types: ["STANDARD"]') == 3
    assert auth.count('allowed_connection_types: ["STANDARD", "WEBSOCKET"]') == 1

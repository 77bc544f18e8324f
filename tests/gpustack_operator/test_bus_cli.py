"""``bus schema`` and ``bus watch`` as a user runs them, against a real nats-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from bus import codec, connection, embedded, events, jwt, publishing, subjects, testing
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from kit import tls

CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")


def test_schema_covers_every_event_kind() -> None:
    result = subprocess.run([CLI, "bus", "schema"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    text = json.dumps(schema)
    for kind in subjects.KINDS:
        assert f'"{kind}"' in text, kind


@pytest.mark.anyio
async def test_watch_prints_retained_state_as_json_lines(tmp_path: Path) -> None:
    async with testing.nats_server(tmp_path) as server:
        settings = testing.settings_for(server)
        async with (
            connection.connect(settings, retry=False) as conn,
            publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
        ):
            for event in testing.example_events("gpu-node.example.com"):
                pub.publish(event)
            await pub.wait_sent()
        env = {**os.environ, "NATS_URL": server.url}
        process = await anyio.open_process(
            [
                CLI,
                "bus",
                "watch",
                "--node",
                "gpu-node.example.com",
                "--subject",
                "gpustack.v1.node.*.devices",
            ],
            env=env,
        )
        try:
            assert process.stdout is not None
            with anyio.fail_after(20):
                line = b""
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive(1)
        finally:
            process.terminate()
            await process.wait()
            await process.aclose()
    document = json.loads(line)
    assert document["kind"] == "devices"
    assert document["node"] == "gpu-node.example.com"


def test_watch_without_a_server_fails_with_one_line() -> None:
    result = subprocess.run(
        [CLI, "bus", "watch", "--nats-url", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert "cannot connect" in result.stderr.splitlines()[-1]


# --- the nats CLI's conventions: --once, -o wide, NATS_* variables and contexts -------------


async def _publish_examples(settings: BusSettings) -> None:
    async with (
        connection.connect(settings, retry=False) as conn,
        publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
    ):
        for event in testing.example_events("gpu-node.example.com"):
            pub.publish(event)
        await pub.wait_sent()


async def _once(*args: str, env: dict[str, str], home: Path) -> subprocess.CompletedProcess[bytes]:
    """``bus watch --once ARGS`` with only ``env`` (and a private HOME) as the environment."""
    environment = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), **env}
    with anyio.fail_after(60):
        return await anyio.run_process(
            [CLI, "bus", "watch", "--once", *args], env=environment, check=False
        )


@pytest.mark.anyio
async def test_once_prints_the_retained_state_and_exits(tmp_path: Path) -> None:
    async with testing.nats_server(tmp_path) as server:
        await _publish_examples(testing.settings_for(server))
        env = {"NATS_URL": server.url}
        result = await _once(env=env, home=tmp_path)
        wide = await _once("-o", "wide", "--kind", "health", env=env, home=tmp_path)
    assert result.returncode == 0, result.stderr
    kinds = [json.loads(line)["kind"] for line in result.stdout.splitlines()]
    assert sorted(kinds) == sorted(subjects.KINDS)
    assert wide.returncode == 0, wide.stderr
    header, row = wide.stdout.decode().splitlines()
    assert header.split() == ["TIME", "NODE", "KIND", "SUMMARY"]
    assert row.split()[1:4] == ["gpu-node.example.com", "health", "GPU-gpu-node.example.com-0"]


@pytest.mark.anyio
async def test_a_closed_pipe_ends_the_watch_quietly(tmp_path: Path) -> None:
    """``bus watch | true``: the reader is gone before the first write; exit 0, no traceback."""
    async with testing.nats_server(tmp_path) as server:
        await _publish_examples(testing.settings_for(server))
        environment = {**os.environ, "NATS_URL": server.url}
        with anyio.fail_after(60):
            result = await anyio.run_process(
                ["/bin/bash", "-c", f"'{CLI}' bus watch --once | true; echo ${{PIPESTATUS[0]}}"],
                env=environment,
                check=False,
            )
    assert result.stdout == b"0\n", result.stderr
    assert b"Traceback" not in result.stderr and b"Broken pipe" not in result.stderr


@pytest.mark.anyio
async def test_nats_user_and_password_and_flags_win(tmp_path: Path) -> None:
    config = 'authorization { user: "person", password: "s3cret" }'
    async with embedded.embedded_server(tmp_path / "n", extra_config=config) as server:
        await _publish_examples(testing.settings_for(server, user="person", password="s3cret"))
        env = {"NATS_URL": server.url, "NATS_USER": "person", "NATS_PASSWORD": "s3cret"}
        good = await _once("--kind", "agent", env=env, home=tmp_path)
        overridden = await _once("--nats-password", "wrong", env=env, home=tmp_path)
        none = await _once(env={"NATS_URL": server.url}, home=tmp_path)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["kind"] == "agent"
    assert overridden.returncode == 1 and b"Authorization" in overridden.stderr
    assert none.returncode == 1 and b"Authorization" in none.stderr


def _context(home: Path, name: str, **fields: str) -> Path:
    path = home / ".config" / "nats" / "context" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"description": "test", **fields}))
    return path


@pytest.mark.anyio
async def test_nats_context_named_or_selected(tmp_path: Path) -> None:
    config = 'authorization { token: "t0ken" }'
    async with embedded.embedded_server(tmp_path / "n", extra_config=config) as server:
        await _publish_examples(testing.settings_for(server, token="t0ken"))
        host = server.url.removeprefix("nats://")  # the nats CLI takes host:port too
        _context(tmp_path, "lab", url=host, token="t0ken")
        _context(tmp_path, "wrong", url=server.url, token="nope")
        named = await _once("--kind", "agent", env={"NATS_CONTEXT": "lab"}, home=tmp_path)
        (tmp_path / ".config" / "nats" / "context.txt").write_text("lab")
        selected = await _once("--kind", "agent", env={}, home=tmp_path)
        # NATS_CONTEXT wins over the selected one, and a flag over the context.
        wrong = await _once(env={"NATS_CONTEXT": "wrong"}, home=tmp_path)
        flag = await _once("--nats-token", "t0ken", env={"NATS_CONTEXT": "wrong"}, home=tmp_path)
        missing = await _once(env={"NATS_CONTEXT": "absent"}, home=tmp_path)
    for result in (named, selected, flag):
        assert result.returncode == 0, result.stderr
    assert json.loads(named.stdout)["kind"] == "agent"
    assert wrong.returncode == 1 and b"Authorization" in wrong.stderr
    assert missing.returncode == 2 and b"NATS_CONTEXT=absent" in missing.stderr


@pytest.mark.anyio
async def test_nats_ca_cert_and_key(tmp_path: Path) -> None:
    """A server that verifies client certificates: NATS_CA trusts it, NATS_CERT/KEY prove us."""
    cert, key = tls.self_signed_certificate("localhost")
    crt, pem = tmp_path / "tls.crt", tmp_path / "tls.key"
    crt.write_bytes(cert)
    pem.write_bytes(key)
    config = f'tls {{ cert_file: "{crt}", key_file: "{pem}", ca_file: "{crt}", verify: true }}'
    async with embedded.embedded_server(tmp_path / "n", extra_config=config) as server:
        url = f"tls://localhost:{server.port}"
        env = {"NATS_URL": url, "NATS_CA": str(crt), "NATS_CERT": str(crt), "NATS_KEY": str(pem)}
        await _publish_examples(
            BusSettings.for_tests(
                url, tls_ca_file=str(crt), tls_cert_file=str(crt), tls_key_file=str(pem)
            )
        )
        good = await _once("--kind", "agent", env=env, home=tmp_path)
        no_cert = await _once(env={"NATS_URL": url, "NATS_CA": str(crt)}, home=tmp_path)
        no_ca = await _once(env={**env, "NATS_CA": ""}, home=tmp_path)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["kind"] == "agent"
    assert no_cert.returncode == 1
    assert no_ca.returncode == 1 and b"CERTIFICATE_VERIFY_FAILED" in no_ca.stderr


@pytest.mark.anyio
async def test_nats_nkey(tmp_path: Path) -> None:
    user = jwt.NKey.generate("user")
    seed = tmp_path / "user.nk"
    seed.write_text(user.seed)
    config = f'authorization {{ users = [ {{ nkey: "{user.public_key}" }} ] }}'
    async with embedded.embedded_server(tmp_path / "n", extra_config=config) as server:
        await _publish_examples(testing.settings_for(server, nkey_seed_file=str(seed)))
        good = await _once(
            "--kind", "agent", env={"NATS_URL": server.url, "NATS_NKEY": str(seed)}, home=tmp_path
        )
        none = await _once(env={"NATS_URL": server.url}, home=tmp_path)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["kind"] == "agent"
    assert none.returncode == 1 and b"Authorization" in none.stderr


@pytest.mark.anyio
async def test_nats_creds(tmp_path: Path) -> None:
    """Operator mode: a user JWT and seed in a .creds file, as ``nsc`` writes it."""
    operator, account, user = (jwt.NKey.generate(k) for k in ("operator", "account", "user"))
    system = jwt.NKey.generate("account")  # JetStream needs a system account in operator mode
    sys_jwt = jwt.encode(
        {"sub": system.public_key, "name": "SYS", "nats": {"type": "account", "version": 2}},
        operator,
    )
    op_jwt = jwt.encode(
        {"sub": operator.public_key, "name": "op", "nats": {"type": "operator", "version": 2}},
        operator,
    )
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1}
    js = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    acc_jwt = jwt.encode(
        {
            "sub": account.public_key,
            "name": "acc",
            "nats": {
                "type": "account",
                "version": 2,
                "limits": {**unlimited, "conn": -1, "leaf": -1, **js},
            },
        },
        operator,
    )
    user_jwt = jwt.encode(
        {
            "sub": user.public_key,
            "name": "u",
            "nats": {"type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1},
        },
        account,
    )
    creds = tmp_path / "user.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed}\n------END USER NKEY SEED------\n"
    )
    config = (
        f"operator: {op_jwt}\nsystem_account: {system.public_key}\nresolver: MEMORY\n"
        f"resolver_preload: {{ {account.public_key}: {acc_jwt}, {system.public_key}: {sys_jwt} }}"
    )
    async with embedded.embedded_server(tmp_path / "n", extra_config=config) as server:
        await _publish_examples(testing.settings_for(server, creds_file=str(creds)))
        good = await _once(
            "--kind", "agent", env={"NATS_URL": server.url, "NATS_CREDS": str(creds)}, home=tmp_path
        )
        none = await _once(env={"NATS_URL": server.url}, home=tmp_path)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["kind"] == "agent"
    assert none.returncode == 1 and b"Authorization" in none.stderr


# --- signals while output blocks; flags checked before connecting; refused credentials ------


def _pipe_bytes(fd: int) -> int:
    """Bytes written into a pipe and not yet read (FIONREAD on its read end)."""
    import array
    import fcntl
    import termios

    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return buf[0]


@pytest.mark.anyio
async def test_sigterm_ends_a_watch_whose_stdout_nobody_reads(tmp_path: Path) -> None:
    """A stalled consumer (a full pipe) must not keep SIGTERM out: the watch exits at once."""
    import signal

    async with testing.nats_server(tmp_path) as server:
        settings = testing.settings_for(server)
        await _publish_examples(settings)
        read_end, write_end = os.pipe()
        log = tmp_path / "stderr"
        with log.open("wb") as errors:
            process = await anyio.open_process(
                [CLI, "bus", "watch", "--nats-url", server.url], stdout=write_end, stderr=errors
            )
        os.close(write_end)
        try:
            event = testing.example_events("gpu-node.example.com", seq=5)[-1]  # an agent event
            payload = codec.encode(event)
            subject = subjects.subject("gpu-node.example.com", events.kind_of(event))
            async with connection.connect(settings, retry=False) as conn:
                # Publish until the pipe (64 KiB here) is about full: nobody reads it.
                with anyio.fail_after(60):
                    while _pipe_bytes(read_end) < 48 * 1024:
                        for _ in range(200):
                            await conn.publish(subject, payload)
                        await conn.flush()
                        await anyio.sleep(0.05)
                    for _ in range(2000):  # and more, so a blocking write would be stuck
                        await conn.publish(subject, payload)
                    await conn.flush()
            await anyio.sleep(0.5)
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):  # generous: it exits within the drain bound, ~1 s
                await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
                await process.aclose()
            os.close(read_end)
    stderr = log.read_text()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_watch_refuses_a_node_that_is_no_node_name_before_connecting() -> None:
    # Port 1 refuses connections: a watch that dialled first would say "cannot connect".
    result = subprocess.run(
        [CLI, "bus", "watch", "--node=a*b", "--nats-url", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--node" in result.stderr
    assert "connect" not in result.stderr


@pytest.mark.anyio
async def test_refused_credentials_say_which_flag_to_pass(tmp_path: Path) -> None:
    async with embedded.embedded_server(
        tmp_path / "nats", extra_config="authorization { token: s3cret }"
    ) as server:
        bare = await anyio.run_process([CLI, "bus", "watch", "--nats-url", server.url], check=False)
        token = tmp_path / "token"
        token.write_text("wrong")
        wrong = await anyio.run_process(
            [CLI, "bus", "watch", "--nats-url", server.url, "--nats-token-file", str(token)],
            check=False,
        )
    assert bare.returncode == 1
    last = bare.stderr.decode().splitlines()[-1]
    # The server answers "Authorization Violation" and closes; the client sometimes sees only
    # the reset, and then the hint says so.
    assert "pass --nats-token-file" in last, last
    assert "Authorization Violation" in last or "Connection reset by peer" in last
    assert wrong.returncode == 1
    last = wrong.stderr.decode().splitlines()[-1]
    assert "check that the credentials of --nats-token-file are current" in last, last

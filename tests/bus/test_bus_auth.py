"""Authentication real clusters use: user/password, token, TLS with a private CA."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from bus import connection, embedded, errors, subjects, testing
from bus.settings import BusSettings
from kit import tls

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


async def _round_trip(settings: BusSettings) -> None:
    async with connection.connect(settings, retry=False) as conn:
        await conn.flush()


async def test_user_and_password(tmp_path: Path) -> None:
    config = 'authorization { user: "agent", password: "s3cret" }'
    async with embedded.embedded_server(tmp_path / "n", extra_config=config) as server:
        good = testing.settings_for(server, user="agent", password="s3cret")
        await _round_trip(good)
        bad = testing.settings_for(server, user="agent", password="wrong")
        with pytest.raises(errors.NotConnected):
            await _round_trip(bad)


async def test_token(tmp_path: Path) -> None:
    config = 'authorization { token: "t0ken" }'
    async with embedded.embedded_server(tmp_path / "n", extra_config=config) as server:
        await _round_trip(testing.settings_for(server, token="t0ken"))
        with pytest.raises(errors.NotConnected):
            await _round_trip(testing.settings_for(server))


async def test_a_password_in_the_url_is_in_no_warning_or_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = BusSettings.for_tests(f"nats://agent:s3cret-pw@127.0.0.1:{embedded.free_port()}")
    with caplog.at_level(logging.DEBUG):
        with anyio.move_on_after(1.0):  # the agents' way: retry, warning each round
            async with connection.connect(settings, retry=True):
                pytest.fail("connected to a closed port")
        with pytest.raises(errors.NotConnected) as refused:  # the CLI tools' way: fail
            await _round_trip(settings)
    assert "cannot connect to nats://agent:REDACTED@127.0.0.1" in caplog.text
    assert "cannot connect to nats://agent:REDACTED@127.0.0.1" in str(refused.value)
    assert "s3cret-pw" not in caplog.text + str(refused.value)


async def test_tls_with_a_private_ca(tmp_path: Path) -> None:
    cert, key = tls.self_signed_certificate("localhost")
    (tmp_path / "server.crt").write_bytes(cert)
    (tmp_path / "server.key").write_bytes(key)
    config = (
        f'tls {{ cert_file: "{tmp_path / "server.crt"}", key_file: "{tmp_path / "server.key"}" }}'
    )
    async with embedded.embedded_server(tmp_path / "n", extra_config=config) as server:
        url = f"tls://localhost:{server.port}"
        trusted = BusSettings.for_tests(url, tls_ca_file=str(tmp_path / "server.crt"))
        await _round_trip(trusted)
        # A client that does not trust the CA must not connect.
        with pytest.raises(errors.NotConnected, match="CERTIFICATE_VERIFY_FAILED"):
            await _round_trip(BusSettings.for_tests(url, tls_ca_file=None))


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        (">", "a", True),
        (">", "a.b", True),
        ("a.>", "a", False),
        ("a.>", "a.b.c", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("*.b", "a.b", True),
        ("a", "a.b", False),
    ],
)
def test_subject_matches(pattern: str, subject: str, matches: bool) -> None:
    assert subjects.matches(pattern, subject) is matches

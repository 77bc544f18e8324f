"""The nats CLI's environment and contexts, layered under our flags (pure; the real-server
tests are in test_bus_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpustack_operator import natsenv
from kit.options import SettingsError


def _ctx(root: Path, name: str, **fields: object) -> None:
    path = root / "nats" / "context" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fields))


def test_flag_then_variable_then_context(tmp_path: Path) -> None:
    _ctx(tmp_path, "c", url="ctx:4222", creds="~/c.creds", ca="/ctx/ca", user="u", password="p")
    env = {"XDG_CONFIG_HOME": str(tmp_path), "NATS_CONTEXT": "c", "NATS_CA": "/env/ca"}
    got = natsenv.layered({"url": "nats://flag:1", "tls_ca_file": None}, env)
    assert got["url"] == "nats://flag:1"
    assert got["tls_ca_file"] == "/env/ca"
    assert got["creds_file"] == str(Path("~/c.creds").expanduser())
    assert (got["user"], got["password"]) == ("u", "p")


def test_a_user_without_password_is_a_token_and_a_host_gets_a_scheme(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "NATS_USER": "tok", "NATS_URL": "a:1, tls://b:2"}
    got = natsenv.layered({}, env)
    assert got == {"token": "tok", "url": "nats://a:1,tls://b:2"}
    # ... but not our own --nats-user flag, which is always a user name.
    assert natsenv.layered({"user": "me"}, env)["user"] == "me"


def test_a_context_by_path_and_one_that_cannot_be_used(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"url": "nats://x:1"}))
    assert natsenv.layered({}, {"NATS_CONTEXT": str(tmp_path / "x.json")})["url"] == "nats://x:1"
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(SettingsError, match="not a JSON object"):
        natsenv.layered({}, {"NATS_CONTEXT": str(tmp_path / "bad.json")})
    _ctx(tmp_path, "nsc", nsc="nsc://op/acc/user")
    with pytest.raises(SettingsError, match="nsc"):
        natsenv.layered({}, {"XDG_CONFIG_HOME": str(tmp_path), "NATS_CONTEXT": "nsc"})


def test_no_context_selected_reads_nothing(tmp_path: Path) -> None:
    assert natsenv.context_path({"XDG_CONFIG_HOME": str(tmp_path)}) is None
    (tmp_path / "nats").mkdir()
    (tmp_path / "nats" / "context.txt").write_text("gone\n")
    assert natsenv.context_path({"XDG_CONFIG_HOME": str(tmp_path)}) is None

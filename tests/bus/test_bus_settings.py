"""Bus settings from the ``--nats-*`` flags: the one mapping every process uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.models import settings as models_settings
from agent.serve import settings as serve_settings
from bus.jwt import NKey
from bus.settings import DEFAULT_URL, from_options, tls_context
from gpustack_operator.flags import FlagError
from gpustack_operator.main import options_for
from kit import tls
from kit.options import SettingsError


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    """A certificate, its key and an NKey seed, as files; and a file that is none of them."""
    cert, key = tls.self_signed_certificate("bus")
    files = {
        "cert": cert,
        "key": key,
        "seed": NKey.generate("user").seed.encode(),
        "garbage": b"not a certificate, a key or a seed\n",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: str(tmp_path / name) for name in files}


def test_flags_map_onto_settings_and_nats_url_fills_an_unset_url(pki: dict[str, str]) -> None:
    argv = ["--nats-user=agent", f"--nats-tls-ca={pki['cert']}", "--nats-state-replicas=3"]
    settings = from_options(options_for(("worker",), argv, {"NATS_URL": "nats://bus:4222"}))
    assert settings.url == "nats://bus:4222"
    assert (settings.user, settings.tls_ca_file, settings.state_replicas) == (
        "agent",
        pki["cert"],
        3,
    )
    assert settings.token is None, "an empty flag is unset, not an empty token"


def test_files_that_load_are_taken(pki: dict[str, str]) -> None:
    argv = [f"--nats-tls-ca={pki['cert']}", f"--nats-tls-cert={pki['cert']}"]
    argv += [f"--nats-tls-key={pki['key']}", f"--nats-nkey-seed={pki['seed']}"]
    settings = from_options(options_for(("worker",), argv))
    assert (settings.tls_key_file, settings.nkey_seed_file) == (pki["key"], pki["seed"])
    assert tls_context(settings) is not None


@pytest.mark.parametrize(
    "flag",
    ["nats-token-file", "nats-nkey-seed", "nats-creds", "nats-tls-ca", "nats-tls-cert"],
)
def test_a_file_flag_naming_no_readable_file_is_refused_at_start(flag: str, tmp_path: Path) -> None:
    for path in (tmp_path / "missing", tmp_path):  # absent, and a directory
        with pytest.raises(SettingsError, match=f"--{flag}: .* is not a readable file"):
            from_options(options_for(("worker",), [f"--{flag}={path}"]))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nats-tls-ca={garbage}"], "TLS files do not load"),
        (["--nats-tls-cert={garbage}"], "TLS files do not load"),
        (["--nats-tls-cert={cert}", "--nats-tls-key={garbage}"], "TLS files do not load"),
        (["--nats-tls-key={key}"], "needs --nats-tls-cert"),
        (["--nats-nkey-seed={garbage}"], "not an NKey seed"),
    ],
)
def test_files_that_do_not_load_are_refused_at_start(
    pki: dict[str, str], argv: list[str], needle: str
) -> None:
    with pytest.raises(SettingsError, match=needle):
        from_options(options_for(("worker",), [a.format(**pki) for a in argv]))


def test_the_flag_wins_over_nats_url_and_the_default_applies_last() -> None:
    env = {"NATS_URL": "nats://b:2"}
    assert (
        from_options(options_for(("worker",), ["--nats-url=nats://a:1"], env)).url == "nats://a:1"
    )
    assert from_options(options_for(("worker",))).url == DEFAULT_URL


@pytest.mark.parametrize("replicas", ["0", "-1", "6"])
def test_state_replicas_out_of_range_is_refused_at_parse_time(replicas: str) -> None:
    with pytest.raises(FlagError, match="nats-state-replicas"):
        options_for(("worker",), [f"--nats-state-replicas={replicas}"])


def test_state_max_age_is_read_and_must_hold_three_republish_periods(tmp_path: Path) -> None:
    dm, socket = ("device-manager", "serve"), f"--kube-socket={tmp_path}/kubelet.sock"
    ok = serve_settings.settings_from(options_for(dm, [socket, "--nats-state-max-age=2h"]))
    assert ok.bus.state_max_age_s == 7200.0
    assert from_options(options_for(("worker",))).state_max_age_s == 3600.0
    with pytest.raises(SettingsError, match="--resync-period"):  # the default 5m: 15m > 10m
        serve_settings.settings_from(options_for(dm, [socket, "--nats-state-max-age=10m"]))
    slow = [socket, "--nats-state-max-age=10m", "--resync-period=1m", "--heartbeat-period=4m"]
    with pytest.raises(SettingsError, match="--heartbeat-period"):
        serve_settings.settings_from(options_for(dm, slow))
    with pytest.raises(FlagError, match="nats-state-max-age"):
        options_for(("worker",), ["--nats-state-max-age=10s"])


def test_the_model_manager_republishes_often_enough_for_the_state_max_age() -> None:
    argv = ["--nats-url=nats://bus:4222", "--nats-state-max-age=6m"]
    assert (
        models_settings.settings_from(options_for(("model-manager",), argv)).tuning.resync_s == 120
    )
    default = models_settings.settings_from(options_for(("model-manager",), argv[:1]))
    assert default.tuning.resync_s == 300.0

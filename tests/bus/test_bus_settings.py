"""Bus settings from the ``--nats-*`` flags: the one mapping every process uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import serve_settings
from agent.models import settings as models_settings
from bus.settings import DEFAULT_URL, from_options
from gpustack_operator.flags import FlagError
from gpustack_operator.main import options_for
from kit.options import SettingsError


def test_flags_map_onto_settings_and_nats_url_fills_an_unset_url() -> None:
    argv = ["--nats-user=agent", "--nats-tls-ca=/ca.pem", "--nats-state-replicas=3"]
    settings = from_options(options_for(("worker",), argv, {"NATS_URL": "nats://bus:4222"}))
    assert settings.url == "nats://bus:4222"
    assert (settings.user, settings.tls_ca_file, settings.state_replicas) == ("agent", "/ca.pem", 3)
    assert settings.token is None, "an empty flag is unset, not an empty token"


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

"""Bus settings from the ``--nats-*`` flags: the one mapping every process uses."""

from __future__ import annotations

import pytest

from bus.settings import DEFAULT_URL, from_options
from gpustack_operator.flags import FlagError
from gpustack_operator.main import options_for


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

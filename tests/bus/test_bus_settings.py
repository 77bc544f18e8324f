"""Bus settings from the ``--nats-*`` flags: the one mapping every process uses."""

from __future__ import annotations

from bus.settings import BusSettings, from_flags


def test_flags_map_onto_settings_and_nats_url_fills_an_unset_url() -> None:
    values: dict[str, object] = {"nats_user": "agent", "nats_tls_ca": "/ca.pem",
                                 "nats_state_replicas": 3, "nats_token": ""}  # fmt: skip
    settings = from_flags(values, {"NATS_URL": "nats://bus:4222"})
    assert settings.url == "nats://bus:4222"
    assert (settings.user, settings.tls_ca_file, settings.state_replicas) == ("agent", "/ca.pem", 3)
    assert settings.token is None, "an empty flag is unset, not an empty token"


def test_the_flag_wins_over_nats_url_and_the_default_applies_last() -> None:
    assert from_flags({"nats_url": "nats://a:1"}, {"NATS_URL": "nats://b:2"}).url == "nats://a:1"
    assert from_flags({}, {}).url == BusSettings().url

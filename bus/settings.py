"""How to reach the bus: one frozen settings Struct, built at the edge and passed explicitly.

Only the command-line edge reads the environment (handed in through :class:`Options`); this
module never touches ``os.environ``. Durations are
seconds (``_s``) and sizes bytes, so the units are in the names.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

import msgspec

from kit.options import Options, SettingsError
from kit.redaction import redact_urls

__all__ = ["DEFAULT_URL", "BusSettings", "from_options"]

DEFAULT_URL: Final = "nats://127.0.0.1:4222"
_SCHEMES: Final = frozenset({"nats", "tls", "ws", "wss"})
"""Where a process looks for the bus when neither ``--nats-url`` nor ``NATS_URL`` says."""


class BusSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Connection, outbox and retention settings shared by agents, control plane and ``watch``."""

    url: str = DEFAULT_URL
    """One server URL or a comma-separated list; the client picks another one on failure."""
    user: str | None = None
    password: str | None = None
    token: str | None = None
    token_file: str | None = None
    """Path of a file holding the token, re-read at every connection (a projected
    ServiceAccount token, which kubelet rotates); wins over ``token``."""
    nkey_seed_file: str | None = None
    """Path of an NKey seed (``SU…``); needs the ``nkeys`` package at run time."""
    creds_file: str | None = None
    """Path of a JWT ``.creds`` file (operator mode)."""
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    connect_timeout_s: float = 5.0
    """Per-attempt TCP/TLS/handshake timeout."""
    reconnect_wait_s: float = 2.0
    """Pause between reconnect attempts to the same server; reconnects never give up."""
    drain_timeout_s: float = 5.0
    """Bound on flushing the outbox and draining subscriptions at shutdown."""
    request_timeout_s: float = 2.0
    """Bound on one JetStream acknowledgement or API request."""
    publish_window: int = 64
    """State events whose JetStream acknowledgement may be awaited at once (at most one per key)."""
    outbox_size: int = 1024
    """Samples kept while disconnected; the oldest are dropped (and counted) beyond it."""
    max_payload_bytes: int = 1024 * 1024
    """Messages larger than this are refused by the decoder (and counted)."""
    samples_max_age_s: float = 150.0
    """How long the last sample of a node is retained: 10 periods of 15 s."""
    history_max_age_s: float = 7 * 24 * 3600.0
    """How long health and allocation history is retained."""
    history_per_node: int = 256
    """Health and allocation events retained per node and kind."""
    state_replicas: int = 1
    """JetStream replicas of the retained-state streams (3 on a three-server cluster)."""
    inbox_prefix: str = "_INBOX"
    """Prefix of this client's reply subjects; per identity (:func:`bus.identity.inbox_prefix`)
    where the server restricts who may read which replies."""

    @property
    def servers(self) -> list[str]:
        """The server URLs, in the order given."""
        return [u.strip() for u in self.url.split(",") if u.strip()]

    @classmethod
    def for_tests(cls, url: str, **overrides: object) -> BusSettings:
        """Short timeouts and waits, so failures in tests show up in well under a second."""
        base = cls(
            url=url,
            connect_timeout_s=1.0,
            reconnect_wait_s=0.1,
            drain_timeout_s=2.0,
            request_timeout_s=1.0,
        )
        return msgspec.structs.replace(base, **overrides)


def server_urls(text: str) -> str:
    """``text`` if every comma-separated entry is a NATS server URL, else :class:`SettingsError`.

    The schemes nats-py speaks: ``nats``, ``tls``, ``ws``, ``wss``; each needs a host.
    """
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls:
        raise SettingsError("--nats-url: no server URL")
    for url in urls:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError as e:
            raise SettingsError(f"--nats-url: {redact_urls(url)!r}: {e}") from e
        if parts.scheme not in _SCHEMES or not parts.hostname:
            raise SettingsError(
                f"--nats-url: {redact_urls(url)!r} is not a NATS server URL "
                "(nats://host:4222; also tls://, ws://, wss://)"
            )
    return text


def from_options(options: Options) -> BusSettings:
    """Build the bus settings from the ``--nats-*`` flags: every NATS-speaking process's edge.

    ``NATS_URL`` fills an unset URL, as the nats tools do.
    """
    url = options.optional_text("nats-url") or options.env.get("NATS_URL") or DEFAULT_URL
    return BusSettings(
        url=server_urls(url),
        user=options.optional_text("nats-user"),
        password=options.optional_text("nats-password"),
        token=options.optional_text("nats-token"),
        token_file=options.optional_text("nats-token-file"),
        nkey_seed_file=options.optional_text("nats-nkey-seed"),
        creds_file=options.optional_text("nats-creds"),
        tls_ca_file=options.optional_text("nats-tls-ca"),
        tls_cert_file=options.optional_text("nats-tls-cert"),
        tls_key_file=options.optional_text("nats-tls-key"),
        state_replicas=options.integer("nats-state-replicas"),
    )

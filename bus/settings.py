"""How to reach the bus: one frozen settings Struct, built at the edge and passed explicitly.

Only the command-line edge reads the environment (handed in through :class:`Options`); this
module never touches ``os.environ``. Durations are
seconds (``_s``) and sizes bytes, so the units are in the names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import msgspec

from kit import files
from kit.options import Flags, Options, SettingsError
from kit.redaction import redact_urls

if TYPE_CHECKING:
    import ssl

__all__ = [
    "DEFAULT_URL",
    "REPUBLISHES_PER_MAX_AGE",
    "BusSettings",
    "NatsFlags",
    "check_republish",
    "from_flags",
    "from_options",
    "tls_context",
]

DEFAULT_URL: Final = "nats://127.0.0.1:4222"
"""Where a process looks for the bus when neither ``--nats-url`` nor ``NATS_URL`` says."""
_SCHEMES: Final = frozenset({"nats", "tls", "ws", "wss"})
REPUBLISHES_PER_MAX_AGE: Final = 3
"""A live node republishes its state at least this often within ``state_max_age_s``, so one or
two lost republishes never expire a node that is still there."""
_GiB: Final = 1 << 30


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
    """First pause before dialing again after a failed round or a lost connection; it doubles
    up to 30 s (:data:`bus.dialing.MAX_BACKOFF_S`), jittered. Reconnects never give up."""
    max_offline_s: float = 300.0
    """The liveness bound: a long-running component off the bus for longer than this (never
    connected since its start, or its connection lost and not back) fails ``/livez``, so
    kubelet restarts it. Well above the worst reconnect (30 s backoff, a connect timeout and
    a stale connection found within 90 s), so only a component that cannot get back fails."""
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
    state_max_age_s: float = 3600.0
    """Node expiry: retained devices, models and agent state not republished for this long is
    dropped by the server (a node gone for good leaves nothing behind). Agents republish far
    more often (see :func:`check_republish`)."""
    state_per_subject: int = 8
    """Messages kept per state subject, so a reader can walk back past garbage to the newest
    valid one (a sender must publish this many bad messages in a row to hide a node's state)."""
    state_max_bytes: int = 4 * _GiB
    """Bytes the state stream may hold; beyond it the oldest messages go (``discard: old``)."""
    samples_max_bytes: int = 1 * _GiB
    history_max_bytes: int = 2 * _GiB
    max_clock_skew_s: float = 300.0
    """Events stamped further than this into the receiver's future are refused (counted as
    ``future``): a sender's clock orders nothing, but a far-future stamp is a lie or a broken
    clock either way."""
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


class NatsFlags(Flags, frozen=True, kw_only=True):
    """The ``--nats-*`` flags of every NATS-speaking command."""

    nats_url: str
    nats_user: str
    nats_password: str
    nats_token: str
    nats_token_file: str
    nats_nkey_seed: str
    nats_creds: str
    nats_tls_ca: str
    nats_tls_cert: str
    nats_tls_key: str
    nats_state_replicas: int
    nats_state_max_age: float


def from_options(options: Options) -> BusSettings:
    """Build the bus settings from the ``--nats-*`` flags: every NATS-speaking process's edge."""
    return from_flags(options.read_flags(NatsFlags), options.env)


def from_flags(flags: NatsFlags, env: Mapping[str, str]) -> BusSettings:
    """The bus settings of flags already read (``NATS_URL`` fills an unset URL, as the nats
    tools do)."""
    url = flags.nats_url or env.get("NATS_URL") or DEFAULT_URL
    client = BusSettings(
        url=server_urls(url),
        user=flags.nats_user or None,
        password=flags.nats_password or None,
        token=flags.nats_token or None,
        token_file=_readable("nats-token-file", flags.nats_token_file),
        nkey_seed_file=_nkey_seed(_readable("nats-nkey-seed", flags.nats_nkey_seed)),
        creds_file=_readable("nats-creds", flags.nats_creds),
        tls_ca_file=_readable("nats-tls-ca", flags.nats_tls_ca),
        tls_cert_file=_readable("nats-tls-cert", flags.nats_tls_cert),
        tls_key_file=_readable("nats-tls-key", flags.nats_tls_key),
        state_replicas=flags.nats_state_replicas,
        state_max_age_s=flags.nats_state_max_age,
    )
    if client.tls_key_file and not client.tls_cert_file:
        raise SettingsError("--nats-tls-key: needs --nats-tls-cert, the certificate it signs for")
    try:
        tls_context(client)  # loads as the client will at every connection, or exits 2 now
    except OSError as e:  # ssl.SSLError is an OSError
        raise SettingsError(f"--nats-tls-ca/-cert/-key: the TLS files do not load: {e}") from e
    return client


def _readable(flag: str, path: str) -> str | None:
    """``--flag``'s path when it is a readable regular file within the input cap (a token, a
    seed, credentials or certificates: kilobytes; the client reads them whole): checked here, so
    a typo exits 2 at start instead of failing every connection attempt for ever."""
    if not path:
        return None
    if not (os.path.isfile(path) and os.access(path, os.R_OK)):
        raise SettingsError(f"--{flag}: {path!r} is not a readable file")
    try:
        files.read_capped(path)
    except files.InputRefused as e:
        raise SettingsError(f"--{flag}: {e}") from e
    return path


def _nkey_seed(path: str | None) -> str | None:
    """``path`` if it holds an NKey seed (``S…``), as the client will read it at connect."""
    if path is None:
        return None
    from bus.errors import InvalidToken
    from bus.jwt import NKey  # nkeys is loaded only by a process that uses a seed

    try:
        with open(path, encoding="ascii") as f:
            NKey(f.read())
    except (OSError, UnicodeError, InvalidToken) as e:
        raise SettingsError(f"--nats-nkey-seed: {path!r}: {e}") from e
    return path


def tls_context(settings: BusSettings) -> ssl.SSLContext | None:
    """The client's TLS context from the ``--nats-tls-*`` files; None when none is given.

    :raises OSError: a file that does not load (``ssl.SSLError`` included).
    """
    if not (settings.tls_ca_file or settings.tls_cert_file):
        return None
    import ssl

    ctx = ssl.create_default_context(cafile=settings.tls_ca_file)
    if settings.tls_cert_file:
        ctx.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return ctx


def check_republish(flag: str, period_s: float, settings: BusSettings) -> None:
    """Refuse a republish period the retained state would expire between.

    A node republishes its state every ``period_s``; the server forgets state older than
    ``state_max_age_s``. Unless the second holds :data:`REPUBLISHES_PER_MAX_AGE` of the first, a
    live node would blink out of the retained state whenever a republish is late or lost.

    :raises SettingsError: naming ``flag`` and ``--nats-state-max-age``.
    """
    if period_s * REPUBLISHES_PER_MAX_AGE > settings.state_max_age_s:
        raise SettingsError(
            f"--{flag} {period_s:g}s: must be at most 1/{REPUBLISHES_PER_MAX_AGE} of "
            f"--nats-state-max-age ({settings.state_max_age_s:g}s), or live nodes expire"
        )

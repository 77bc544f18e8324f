"""``bus watch`` and ``bus schema``: the operator's and dashboard author's view of the bus.

The process edge for the bus tools: their settings from the parsed flags (the ``--nats-*``
family, under which the nats CLI's own environment and contexts apply:
:mod:`gpustack_operator.natsenv`). ``bus watch`` runs as a service under the process runner
(:func:`gpustack_operator.buswatching.main`); ``bus schema`` is a one-shot.
"""

from __future__ import annotations

import json
import sys
from typing import Literal, cast

import msgspec

from bus import codec, identity, subjects, subscribing
from bus.errors import BusError
from bus.settings import BusSettings, NatsFlags, from_flags, server_urls
from gpustack_operator import natsenv
from kit.options import Flags, Options, SettingsError

__all__ = [
    "SchemaSettings",
    "WatchSettings",
    "credentials_hint",
    "schema_command",
    "schema_settings",
    "watch_settings",
]


class WatchSettings(msgspec.Struct, frozen=True, kw_only=True):
    bus: BusSettings
    node: str | None
    """Only this node; combined with ``subject`` when both are given."""
    subject: str | None
    """A filter such as ``gpustack.v1.node.*.health``."""
    kind: subjects.Kind | None = None
    """Only this kind; combined with ``node`` and ``subject``."""
    output: Literal["json", "yaml", "wide"]
    once: bool = False
    """Print the retained state and exit (the nats CLI's ``--terminate-at-end``)."""


class SchemaSettings(msgspec.Struct, frozen=True):
    """``bus schema`` has no flags of its own."""


_DASHBOARD_INBOX = identity.inbox_prefix(identity.Identity(role="dashboard"))


class WatchFlags(Flags, frozen=True, kw_only=True):
    """The flags of ``bus watch`` (its bus's are :class:`~bus.settings.NatsFlags`)."""

    node: str
    subject: str
    kind: str
    output: str
    once: bool


def watch_settings(options: Options) -> WatchSettings:
    """Every flag is checked here, before anything connects: a mistake is one line, exit 2.

    :raises SettingsError: a ``--node`` that is no node name, a ``--subject`` outside the
        bus's subject space, or one that excludes ``--node`` or ``--kind``; a bad ``NATS_*``
        value or nats context.
    """
    flags = options.read_flags(WatchFlags)
    subject, node = flags.subject or None, flags.node or None
    kind = cast(subjects.Kind | None, flags.kind or None)
    if node is not None:
        try:
            subjects.encode_node(node)
        except BusError as e:
            raise SettingsError(f"--node: {e}") from e
    if subject is not None:
        try:
            sub_node, sub_kind = subscribing.parse_filter(subject)
        except BusError as e:
            raise SettingsError(f"--subject: {e}") from e
        if node is not None and sub_node is not None and sub_node != node:
            raise SettingsError(f"--node {node} and --subject {subject} exclude each other")
        if kind is not None and sub_kind is not None and sub_kind != kind:
            raise SettingsError(f"--kind {kind} and --subject {subject} exclude each other")
    return WatchSettings(
        # A dashboard's reply subjects (bus.identity): what the servers let dashboards read.
        bus=msgspec.structs.replace(nats_cli_settings(options), inbox_prefix=_DASHBOARD_INBOX),
        node=node,
        subject=subject,
        kind=kind,
        output=cast(Literal["json", "yaml", "wide"], flags.output),
        once=flags.once,
    )


def nats_cli_settings(options: Options) -> BusSettings:
    """The bus settings of a tool a person runs: the ``--nats-*`` flags, then the nats CLI's
    ``NATS_*`` variables, then its context (:mod:`gpustack_operator.natsenv`).

    :raises SettingsError: a bad URL, a missing or unreadable context.
    """
    nats = options.read_flags(NatsFlags)
    base = from_flags(nats, options.env)
    given = {
        "url": nats.nats_url, "user": nats.nats_user, "password": nats.nats_password,
        "token": nats.nats_token, "creds_file": nats.nats_creds,
        "nkey_seed_file": nats.nats_nkey_seed, "tls_cert_file": nats.nats_tls_cert,
        "tls_key_file": nats.nats_tls_key, "tls_ca_file": nats.nats_tls_ca,
    }  # fmt: skip
    values = natsenv.layered({k: v or None for k, v in given.items()}, options.env)
    if "url" in values:
        values["url"] = server_urls(values["url"])
    return msgspec.structs.replace(base, **values)


_REFUSED = ("authorization violation", "authentication", "authorization")
_RESET = "connection reset by peer"
"""How a server that requires credentials often ends a connection that has none: it answers
``-ERR 'Authorization Violation'`` and closes, and the client may see only the reset."""


def credentials_hint(settings: BusSettings, error: str) -> str | None:
    """What to do next when the server refused the connection for its credentials (``error``
    is the connection's failure); None for any other failure. A pure function of the settings
    that were presented: the hint names the flags to add, or the ones to check."""
    text = error.lower()
    refused = any(word in text for word in _REFUSED)
    presented = [
        flag
        for flag, value in (
            ("--nats-token-file", settings.token_file),
            ("--nats-token", settings.token),
            ("--nats-creds", settings.creds_file),
            ("--nats-nkey-seed", settings.nkey_seed_file),
            ("--nats-user", settings.user),
        )
        if value
    ]
    if not refused and _RESET not in text:
        return None
    if presented:
        advice = (
            f"check that the credentials of {', '.join(presented)} are current and that "
            "their user may watch the bus (docs/bus.md)"
        )
    else:
        advice = (
            "pass --nats-token-file (a ServiceAccount token the worker's auth callout "
            "accepts, docs/bus.md), or --nats-creds, --nats-nkey-seed, "
            "--nats-user/--nats-password"
        )
    if refused:
        given = "refused the credentials given" if presented else "requires credentials"
        return f"the server {given}: {advice}"
    return f"the server closed the connection; if it requires credentials, {advice}"


def schema_settings(options: Options) -> SchemaSettings:
    return SchemaSettings()


def schema_command(settings: SchemaSettings) -> int:
    """Print the JSON Schema of every bus event (one document)."""
    sys.stdout.write(json.dumps(codec.json_schema(), indent=2, sort_keys=True) + "\n")
    return 0

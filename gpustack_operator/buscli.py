"""``bus watch`` and ``bus schema``: the operator's and dashboard author's view of the bus.

The process edge for the bus tools: their settings from the parsed flags (the ``--nats-*``
family, with ``NATS_URL`` honoured as the nats tools do). ``bus watch`` runs as a service under
the process runner (:func:`gpustack_operator.buswatching.main`); ``bus schema`` is a one-shot.
"""

from __future__ import annotations

import json
import sys
from typing import Literal, cast

import msgspec

from bus import codec, identity, subscribing
from bus.errors import BusError
from bus.settings import BusSettings, from_options
from kit.options import Options, SettingsError

__all__ = ["SchemaSettings", "WatchSettings", "schema_command", "schema_settings", "watch_settings"]


class WatchSettings(msgspec.Struct, frozen=True, kw_only=True):
    bus: BusSettings
    node: str | None
    """Only this node; combined with ``subject`` when both are given."""
    subject: str | None
    """A filter such as ``gpustack.v1.node.*.health``."""
    output: Literal["json", "yaml"]


class SchemaSettings(msgspec.Struct, frozen=True):
    """``bus schema`` has no flags of its own."""


_DASHBOARD_INBOX = identity.inbox_prefix(identity.Identity(role="dashboard"))


def watch_settings(options: Options) -> WatchSettings:
    """:raises SettingsError: a ``--subject`` outside the bus's subject space, or one that
    excludes ``--node``."""
    subject = options.optional_text("subject")
    node = options.optional_text("node")
    if subject is not None:
        try:
            sub_node, _ = subscribing.parse_filter(subject)
        except BusError as e:
            raise SettingsError(f"--subject: {e}") from e
        if node is not None and sub_node is not None and sub_node != node:
            raise SettingsError(f"--node {node} and --subject {subject} exclude each other")
    return WatchSettings(
        # A dashboard's reply subjects (bus.identity): what the servers let dashboards read.
        bus=msgspec.structs.replace(from_options(options), inbox_prefix=_DASHBOARD_INBOX),
        node=node,
        subject=subject,
        output=cast(Literal["json", "yaml"], options.text("output")),
    )


def schema_settings(options: Options) -> SchemaSettings:
    return SchemaSettings()


def schema_command(settings: SchemaSettings) -> int:
    """Print the JSON Schema of every bus event (one document)."""
    sys.stdout.write(json.dumps(codec.json_schema(), indent=2, sort_keys=True) + "\n")
    return 0

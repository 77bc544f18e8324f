"""``bus watch`` and ``bus schema``: the operator's and dashboard author's view of the bus.

The process edge for the bus tools: builds :class:`BusSettings` from the parsed flags (the
``--nats-*`` family, with ``NATS_URL`` honoured as nats tools do) and runs one tool.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import cast

import anyio

from bus import codec, errors, watching
from bus.settings import BusSettings

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_USAGE = 2


def settings_from(values: Mapping[str, object], env: Mapping[str, str]) -> BusSettings:
    """Build the bus settings from ``--nats-*`` flags; ``NATS_URL`` fills an unset URL."""

    def text(name: str) -> str | None:
        return cast(str, values.get(name) or "") or None

    return BusSettings(
        url=text("nats_url") or env.get("NATS_URL") or BusSettings().url,
        user=text("nats_user"),
        password=text("nats_password"),
        token=text("nats_token"),
        nkey_seed_file=text("nats_nkey_seed"),
        creds_file=text("nats_creds"),
        tls_ca_file=text("nats_tls_ca"),
        tls_cert_file=text("nats_tls_cert"),
        tls_key_file=text("nats_tls_key"),
        state_replicas=int(cast(int, values.get("nats_state_replicas") or 1)),
    )


def watch_command(values: dict[str, object], positionals: list[str]) -> int:
    """Print the retained state of matching nodes, then live events, until interrupted."""
    if positionals:
        print(f"unexpected arguments: {' '.join(positionals)}", file=sys.stderr)
        return EXIT_USAGE
    settings = settings_from(values, os.environ)
    node = cast(str, values["node"]) or None
    subject = cast(str, values["subject"]) or None
    fmt = cast(str, values["output"])

    async def main() -> None:
        await watching.watch(settings=settings, node=node, subject=subject, fmt=fmt, out=sys.stdout)

    try:
        anyio.run(main)
    except KeyboardInterrupt:
        return 0
    except (errors.BusError, ValueError) as e:
        log.error("bus watch: %s", e)
        return EXIT_FAILED
    return 0


def schema_command(values: dict[str, object], positionals: list[str]) -> int:
    """Print the JSON Schema of every bus event (one document)."""
    if positionals:
        print(f"unexpected arguments: {' '.join(positionals)}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(json.dumps(codec.json_schema(), indent=2, sort_keys=True) + "\n")
    return 0

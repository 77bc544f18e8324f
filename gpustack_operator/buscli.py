"""``bus watch`` and ``bus schema``: the operator's and dashboard author's view of the bus.

The process edge for the bus tools: builds :class:`BusSettings` from the parsed flags (the
``--nats-*`` family, with ``NATS_URL`` honoured as nats tools do) and runs one tool.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import cast

import anyio

from bus import codec, errors
from bus.settings import from_flags
from gpustack_operator import buswatching

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_USAGE = 2


def watch_command(values: dict[str, object], positionals: list[str]) -> int:
    """Print the retained state of matching nodes, then live events, until interrupted."""
    if positionals:
        print(f"unexpected arguments: {' '.join(positionals)}", file=sys.stderr)
        return EXIT_USAGE
    settings = from_flags(values, os.environ)
    node = cast(str, values["node"]) or None
    subject = cast(str, values["subject"]) or None
    fmt = cast(str, values["output"])

    async def main() -> None:
        await buswatching.watch(
            settings=settings, node=node, subject=subject, fmt=fmt, out=sys.stdout
        )

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

"""``gpustack-operator bus watch``: print the retained state of the bus, then follow it live.

One document per event, flushed per line so ``watch … | jq`` and ``| head`` work as expected:
``json`` writes one compact JSON object per line; ``yaml`` writes documents separated by
``---``. The output is the wire form (camelCase keys), so it can be replayed onto the bus.
"""

from __future__ import annotations

import logging
import sys
from typing import Final, TextIO

import anyio
import msgspec
import yaml

from bus import codec, connection, events, subjects, subscribing
from bus.errors import StateUnavailable
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from gpustack_operator.buscli import WatchSettings

__all__ = ["FORMATS", "format_event", "main", "watch"]

log = logging.getLogger(__name__)

FORMATS: Final = ("json", "yaml")
STATE_RETRY_S: Final = 1.0


def format_event(event: events.Event, fmt: str) -> str:
    """One event as text in ``fmt``, ending with a newline.

    :raises ValueError: ``fmt`` is not one of :data:`FORMATS`.
    """
    if fmt == "json":
        return codec.encode(event).decode() + "\n"
    if fmt == "yaml":
        # Through JSON first, so YAML shows exactly the wire form (camelCase, RFC 3339 strings).
        doc = msgspec.json.decode(codec.encode(event))
        return "---\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


async def watch(
    *, settings: BusSettings, node: str | None, subject: str | None, fmt: str, out: TextIO
) -> None:
    """Print retained state of every matching node, then live events, until cancelled.

    :param node: only this node (combined with ``subject`` when both are given).
    :param subject: a filter such as ``gpustack.v1.node.*.health``.
    :raises ValueError: unknown ``fmt``.
    :raises InvalidSubject: ``subject`` is outside the bus's subject space.
    :raises InvalidNodeName: ``node`` cannot be put in a subject.
    :raises NotConnected: no server answered.

    Until the retention streams exist (no agent or worker has run yet) it waits for them.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    kind = None
    if subject is not None:
        sub_node, kind = subscribing.parse_filter(subject)
        node = node or sub_node
        if sub_node is not None and sub_node != node:
            return  # the two filters exclude each other
    async with connection.connect(settings, name="bus-watch", retry=False) as conn:
        while True:
            try:
                await _follow(conn, settings, node, kind, fmt, out)
            except StateUnavailable as e:
                # A dashboard may start before any agent: wait for the state to appear.
                log.warning("waiting for the bus's retained state: %s", e)
                await anyio.sleep(STATE_RETRY_S)


async def _follow(
    conn: connection.Connection,
    settings: BusSettings,
    node: str | None,
    kind: subjects.Kind | None,
    fmt: str,
    out: TextIO,
) -> None:
    async with subscribing.subscribe(
        conn, settings=settings, metrics=BusMetrics(), node=node, kind=kind, include_state=True
    ) as sub:
        async for event in sub:
            out.write(format_event(event, fmt))
            out.flush()


async def main(settings: WatchSettings) -> None:
    """The ``bus watch`` service: print to standard output until stopped."""
    await watch(
        settings=settings.bus,
        node=settings.node,
        subject=settings.subject,
        fmt=settings.output,
        out=sys.stdout,
    )

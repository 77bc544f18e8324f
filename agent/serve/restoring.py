"""Rebuild the device plugin's ledger after a restart from what the bus retained.

The ledger lives in the agent's memory; the bus keeps a bounded history of its changes
(``allocations`` events, see docs/bus.md). On start the agent reads this node's history, folds it
into the allocations still in force, and hands them to the device plugins, which re-charge them
on the first detection pass. The kubelet pod-resources API then corrects anything the history
missed (an allocation older than the retained history, a container gone while we were down).

When the bus cannot be read at start, the ledger the agent kept on the node
(:mod:`agent.serve.holdingsfile`) stands in for the history, so kubelet is not served an empty ledger.
"""

from __future__ import annotations

import logging

import anyio

from agent.deviceplugin.holdings import live_allocations
from agent.serve import holdingsfile
from agent.serve.settings import ServeSettings
from bus import events, state
from bus.connection import connect
from bus.errors import BusError

log = logging.getLogger(__name__)


async def initial_allocations(settings: ServeSettings) -> list[events.AllocationEvent]:
    """The allocations to rebuild the ledger from: the bus's, else the node's own copy."""
    retained = await retained_allocations(settings)
    if retained is not None:
        return retained
    kept = await holdingsfile.load(settings.ledger_path, settings.node_name)
    if kept:
        log.info(
            "the bus is unreachable: rebuilding the ledger from %d allocation(s) kept in %s",
            len(kept),
            settings.ledger_path,
        )
    return kept


async def retained_allocations(settings: ServeSettings) -> list[events.AllocationEvent] | None:
    """This node's allocations still in force according to the bus, to rebuild the ledger.

    Best effort and bounded: with no bus at start the agent still serves kubelet, so any bus
    failure (or no answer in time) yields None: "the bus cannot say", not "nothing is held".
    """
    history: list[events.AllocationEvent] = []
    limit_s = settings.bus.connect_timeout_s + settings.bus.request_timeout_s
    with anyio.move_on_after(limit_s) as scope:
        try:
            async with connect(settings.bus, name=f"agent/{settings.node_name}/restore",
                               retry=False) as conn:  # fmt: skip
                raw = await state.history(
                    conn, settings.bus, node=settings.node_name, kind="allocations"
                )
        except BusError as e:
            log.warning("no retained allocations to rebuild the ledger from: %s", e)
            return None
        guard = state.guard_for(settings.bus)  # refuses (and logs) garbage and future stamps
        for subject, data in raw:
            event = guard.accept(subject, data)
            if isinstance(event, events.AllocationEvent):
                history.append(event)
    if scope.cancelled_caught:
        log.warning("no retained allocations to rebuild the ledger from: the bus did not answer")
        return None
    live = live_allocations(history)
    if live:
        log.info("rebuilding the ledger from %d retained allocation(s)", len(live))
    return live

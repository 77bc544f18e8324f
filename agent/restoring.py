"""Rebuild the device plugin's ledger after a restart from what the bus retained.

The ledger lives in the agent's memory; the bus keeps a bounded history of its changes
(``allocations`` events, see docs/bus.md). On start the agent reads this node's history, folds it
into the allocations still in force, and hands them to the device plugins, which re-charge them
on the first detection pass. The kubelet pod-resources API then corrects anything the history
missed (an allocation older than the retained history, a container gone while we were down).
"""

from __future__ import annotations

import logging

import anyio

from agent.deviceplugin.ledger import live_allocations
from agent.serve_settings import ServeSettings
from bus import events, state
from bus.connection import connect
from bus.errors import BusError

log = logging.getLogger(__name__)


async def retained_allocations(settings: ServeSettings) -> list[events.AllocationEvent]:
    """This node's allocations still in force according to the bus, to rebuild the ledger.

    Best effort and bounded: with no bus at start the agent still serves kubelet (the
    pod-resources API then corrects the ledger), so any bus failure yields an empty list.
    """
    history: list[events.AllocationEvent] = []
    with anyio.move_on_after(settings.bus.connect_timeout_s + settings.bus.request_timeout_s):
        try:
            async with connect(settings.bus, name=f"agent/{settings.node_name}/restore",
                               retry=False) as conn:  # fmt: skip
                raw = await state.history(
                    conn, settings.bus, node=settings.node_name, kind="allocations"
                )
        except BusError as e:
            log.warning("no retained allocations to rebuild the ledger from: %s", e)
            return []
        guard = state.guard_for(settings.bus)  # refuses (and logs) garbage and future stamps
        for subject, data in raw:
            event = guard.accept(subject, data)
            if isinstance(event, events.AllocationEvent):
                history.append(event)
    live = live_allocations(history)
    if live:
        log.info("rebuilding the ledger from %d retained allocation(s)", len(live))
    return live

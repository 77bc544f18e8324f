"""The processor's listeners, given at construction (no loop): who is told which ledger change."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import cast

from prometheus_client import CollectorRegistry

from bus import events
from controlplane.metrics import WorkerMetrics
from controlplane.reconciling.nodes import NodeReconciler
from controlplane.reconciling.nodestates import Ledger
from controlplane.reconciling.processing import Listeners, Processor
from controlplane.reconciling.sinks import Sink

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Heard:
    """Every listener Protocol at once, keeping what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, object]] = []

    def note(self, event: events.Event) -> None:
        self.told.append((events.kind_of(event), event.node))

    def state_changed(self, node: str) -> None:
        self.told.append(("state", node))

    def models_changed(self, digests: Iterable[str]) -> None:
        self.told.append(("digests", sorted(digests)))

    def held(self) -> Collection[str] | None:
        return None


def processor(listeners: Listeners) -> Processor:
    ledger, metrics = Ledger(max_nodes=2), WorkerMetrics(CollectorRegistry())
    return Processor(
        ledger=ledger, reconciler=NodeReconciler(ledger=ledger, sink=cast(Sink, None),
                                                 metrics=metrics),
        sink=cast(Sink, None), metrics=metrics, listeners=listeners,
    )  # fmt: skip


def test_each_listener_hears_only_the_changes_of_its_kind() -> None:
    heard = Heard()
    p = processor(Listeners(allocations=heard, models_events=heard, digests=heard, states=heard))
    allocated = events.AllocationEvent(
        node="n", ts=T0, allocation_id="p/c", action="allocated", resource="r", device_ids=("d",)
    )
    p.ingest(allocated)
    assert heard.told == [("state", "n"), ("allocations", "n")]
    heard.told.clear()
    cached = events.ModelState(model="hf://a", state="ready", digest="sha256:a")
    p.ingest(events.ModelsEvent(node="n", ts=T0 + timedelta(1), models=(cached,)))
    assert heard.told == [("state", "n"), ("digests", ["sha256:a"]), ("models", "n")]
    heard.told.clear()
    p.ingest(events.ModelsEvent(node="n", ts=T0 + timedelta(2)))  # the model left the cache
    assert heard.told == [("state", "n"), ("digests", ["sha256:a"]), ("models", "n")]


def test_an_event_that_changes_nothing_or_is_refused_tells_nobody() -> None:
    heard = Heard()
    p = processor(Listeners(allocations=heard, states=heard))
    first = events.DevicesEvent(node="a", ts=T0)
    p.ingest(first)
    heard.told.clear()
    p.ingest(events.DevicesEvent(node="a", ts=T0 - timedelta(1)))  # older: not applied
    p.ingest(events.DevicesEvent(node="b", ts=T0))
    p.ingest(events.DevicesEvent(node="c", ts=T0))  # past max_nodes: refused
    assert heard.told == [("state", "b")]


def test_no_listeners_is_a_processor_that_only_folds() -> None:
    p = processor(Listeners())
    p.ingest(events.DevicesEvent(node="a", ts=T0))
    assert p.ledger.get("a") is not None

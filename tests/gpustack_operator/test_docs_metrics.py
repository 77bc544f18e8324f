"""docs/metrics.md names exactly the metrics the services register, as a scrape shows them
(a counter with its ``_total``: the name a query must use), so the doc cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

import kit.serving  # noqa: F401 - what every /metrics endpoint imports: no _created series
from agent.models.metrics import ModelMetrics
from agent.serve import metrics as agent_metrics
from bus.metrics import BusMetrics
from controlplane.metrics import WorkerMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _registered() -> set[str]:
    """Every family's name as the text ``/metrics`` serves writes it (its ``# TYPE`` line)."""
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    BusMetrics(registry)
    ModelMetrics(registry)
    text = generate_latest(registry).decode()
    names = set(re.findall(r"^# TYPE (gpustack_[a-z_]+) ", text, re.MULTILINE))
    accelerators = {
        f"gpustack_accelerator_{s.name}" + ("_total" if s.counter else "")
        for s in agent_metrics.SERIES
    }
    return names | accelerators | {agent_metrics.LAST_XID}


def _counters_in_tables() -> set[str]:
    return set(
        re.findall(
            r"^\| `(gpustack_[a-z_]+)` \|(?:[^|\n]*\|)?\s*counter\s*\|",
            DOC.read_text(),
            re.MULTILINE,
        )
    )


def test_every_documented_counter_carries_total() -> None:
    counters = _counters_in_tables()
    assert len(counters) > 15
    assert {c for c in counters if not c.endswith("_total")} == set()


def test_every_documented_metric_is_registered() -> None:
    documented = set(re.findall(r"`(gpustack_[a-z_]+)`", DOC.read_text()))
    agent_own = {n for n in documented if n.startswith("gpustack_agent_")} | {
        "gpustack_bus_outbox_depth"
    }
    missing = documented - _registered() - agent_own
    assert missing == set(), f"documented but not registered: {sorted(missing)}"
    source = Path(agent_metrics.__file__).read_text()
    moved = [n for n in agent_own if f'"{n.removesuffix("_total")}"' not in source]
    assert moved == [], "agent metric names moved"


def test_every_registered_metric_is_documented() -> None:
    documented = set(re.findall(r"`(gpustack_[a-z_]+)`", DOC.read_text()))
    assert _registered() - documented == set()

"""docs/metrics.md names exactly the metrics the services register (the doc cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from agent import metrics as agent_metrics
from agent.models.metrics import ModelMetrics
from bus.metrics import BusMetrics
from controlplane.metrics import WorkerMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _registered() -> set[str]:
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    BusMetrics(registry)
    ModelMetrics(registry)
    names = {family.name for family in registry.collect()}
    accelerators = {f"gpustack_accelerator_{s.name}" for s in agent_metrics.SERIES}
    return names | accelerators | {agent_metrics.LAST_XID}


def test_every_documented_metric_is_registered() -> None:
    documented = set(re.findall(r"`(gpustack_[a-z_]+)`", DOC.read_text()))
    agent_own = {n for n in documented if n.startswith("gpustack_agent_")} | {
        "gpustack_bus_outbox_depth"
    }
    missing = documented - _registered() - agent_own
    assert missing == set(), f"documented but not registered: {sorted(missing)}"
    source = Path(agent_metrics.__file__).read_text()
    assert all(f'"{name}"' in source for name in agent_own), "agent metric names moved"


def test_every_registered_metric_is_documented() -> None:
    documented = set(re.findall(r"`(gpustack_[a-z_]+)`", DOC.read_text()))
    assert _registered() - documented == set()

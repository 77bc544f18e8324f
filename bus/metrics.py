"""Prometheus counters of the bus, on a registry the caller owns.

One :class:`BusMetrics` per process (or per test): creating two on the same registry would
register the same metric names twice, which prometheus_client refuses.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

__all__ = ["BusMetrics"]


class BusMetrics:
    """The bus's counters. Pass ``registry`` to export them; by default they stay private."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.dropped = Counter(
            "gpustack_bus_dropped_messages",
            "Received messages refused by the decoder, by subject kind and reason.",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.outbox_dropped = Counter(
            "gpustack_bus_outbox_dropped_events",
            "Events dropped from a full outbox while disconnected (samples only), by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.published = Counter(
            "gpustack_bus_published_events",
            "Events handed to the server, by kind.",
            ["kind"],
            registry=self.registry,
        )

    def dropped_count(self, kind: str, reason: str) -> float:
        """The current value of one drop counter (for tests and the benchmark)."""
        value = self.registry.get_sample_value(
            "gpustack_bus_dropped_messages_total", {"kind": kind, "reason": reason}
        )
        return value or 0.0

    def total_dropped(self) -> float:
        """Sum of every drop counter."""
        return sum(
            s.value for m in self.dropped.collect() for s in m.samples if s.name.endswith("_total")
        )

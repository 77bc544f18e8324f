"""The worker's Prometheus metrics, on a registry the caller owns (one instance per registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["WorkerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_EVENT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0,
    1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)  # fmt: skip
"""Fine around 1 s: the target is p99 < 1 s from an event's publication to its object."""


class WorkerMetrics:
    """Events consumed and rejected, reconcile latency, API and KV writes, queue depth, leadership.

    Decode errors of bus messages are ``gpustack_bus_dropped_messages_total`` from
    :class:`bus.metrics.BusMetrics` on the same registry.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter(
            "gpustack_worker_events_consumed", "Bus events consumed, by kind.", ["kind"], registry=r
        )
        self.rejected = Counter(
            "gpustack_worker_events_rejected",
            "Events or nodes refused by the worker, by kind and reason (unknown_node, "
            "queue_full, too_many_nodes, too_many_allocations, unknown_device).",
            ["kind", "reason"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "gpustack_worker_reconcile_seconds",
            "Time to reconcile one key, by object kind (node, modelartifact).",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.event_to_object_seconds = Histogram(
            "gpustack_worker_event_to_object_seconds",
            "From the oldest unreconciled event's timestamp to its node's objects being written.",
            buckets=_EVENT_BUCKETS,
            registry=r,
        )
        self.api_requests = Counter(
            "gpustack_worker_api_requests",
            "Requests to the Kubernetes API (verbs get, create, patch, update, delete, watch; "
            "result ok or the HTTP status) and operations on the bus KV buckets (verbs kv_get, "
            "kv_put, kv_delete, kv_keys; result ok, conflict or error).",
            ["verb", "result"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "gpustack_worker_queue_depth", "Keys waiting for a reconcile.", registry=r
        )
        self.leader = Gauge(
            "gpustack_worker_leader", "1 while this replica holds the lease.", registry=r
        )

    def observe_request(self, verb: str, result: str) -> None:
        self.api_requests.labels(verb=verb, result=result).inc()

    def count(self, name: str, **labels: str) -> float:
        """The current value of one sample (tests and the benchmark)."""
        return self.registry.get_sample_value(name, labels) or 0.0

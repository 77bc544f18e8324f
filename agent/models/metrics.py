"""Prometheus metrics of the model plugin. No label names a namespace, artifact, repo or Pod."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ModelMetrics"]

_PREFIX = "gpustack_model_manager_"


class ModelMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.download_bytes = Counter(
            _PREFIX + "download_bytes", "Bytes received, by source.", ["source"], registry=r
        )
        self.mounts = Counter(
            _PREFIX + "mounts",
            "NodePublishVolume answers: hit, materialized, denied, pending, failed.",
            ["result"],
            registry=r,
        )
        self.materializations = Counter(
            _PREFIX + "materializations",
            "Finished attempts: published or the failure reason.",
            ["result"],
            registry=r,
        )
        self.publish_duration = Histogram(
            _PREFIX + "publish_duration_seconds",
            "From the start of an attempt to its publication.",
            buckets=[2.0**i for i in range(16)],
            registry=r,
        )
        self.gc_removed_bytes = Counter(
            _PREFIX + "gc_removed_bytes", "Bytes freed by collection.", registry=r
        )
        self.stored_bytes = Gauge(
            _PREFIX + "stored_bytes", "Bytes of published and partial models.", registry=r
        )
        self.capacity_bytes = Gauge(
            _PREFIX + "capacity_bytes", "Size of the cache's filesystem.", registry=r
        )

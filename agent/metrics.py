"""The device agent's Prometheus metrics: per-accelerator gauges and the agent's own health.

Per-accelerator series are produced at scrape time from the latest detection and monitor pass
(a custom collector), so a card that disappears takes its series with it and a value the
hardware did not report is absent, never ``0``. Their labels are those of NVIDIA's DCGM exporter,
so a Grafana dashboard written for DCGM is adapted by renaming the metrics only:

=============================================  ========================================  =======
gpustack-operator                              DCGM exporter                             unit
=============================================  ========================================  =======
``gpustack_accelerator_memory_total_mib``      ``DCGM_FI_DEV_FB_FREE`` + ``_FB_USED``     MiB
``gpustack_accelerator_memory_used_mib``       ``DCGM_FI_DEV_FB_USED``                   MiB
``gpustack_accelerator_utilization_percent``   ``DCGM_FI_DEV_GPU_UTIL``                  %
``gpustack_accelerator_temperature_celsius``   ``DCGM_FI_DEV_GPU_TEMP``                  °C
``gpustack_accelerator_power_watts``           ``DCGM_FI_DEV_POWER_USAGE``               W
``gpustack_accelerator_unhealthy``             none (nearest ``DCGM_FI_DEV_XID_ERRORS``)  0/1
=============================================  ========================================  =======

Labels on every accelerator series: ``gpu`` (the index within its manufacturer), ``UUID`` (the
accelerator id), ``device`` (``nvidia<minor>``, ``card<N>`` for AMD), ``modelName``, ``Hostname``
(the node name; DCGM's newest releases spell it ``hostname``), ``pci_bus_id``, plus
``manufacturer`` (DCGM has none; dashboards may ignore it). A label the hardware did not report
is the empty string.

Agent health: ``gpustack_agent_detection_pass_seconds`` and
``gpustack_agent_monitor_pass_seconds`` (histograms), ``gpustack_agent_pass_failures_total``
(by manufacturer), ``gpustack_agent_nvml_errors_total`` (by NVML ``call``),
``gpustack_bus_outbox_depth`` and ``gpustack_bus_outbox_dropped_events_total`` (the latter from
:class:`bus.metrics.BusMetrics`), ``gpustack_agent_kubelet_registrations_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bus import devices

LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "manufacturer")

_GAUGES: tuple[tuple[str, str, Callable[[devices.AcceleratorSample], float | None]], ...] = (
    ("memory_total_mib", "Memory of the accelerator, MiB.", lambda s: s.memory),
    ("memory_used_mib", "Memory in use, MiB.", lambda s: s.memory_usage),
    ("utilization_percent", "Core utilization, percent.", lambda s: s.cores_utilization),
    ("temperature_celsius", "Core temperature, degrees Celsius.", lambda s: s.temperature),
    ("power_watts", "Power drawn, watts.", lambda s: s.power_usage),
    ("unhealthy", "1 when the accelerator is Unhealthy.", lambda s: float(s.unhealthy)),
)

_PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Sources:
    """Where the scrape-time values come from; each is a cheap, non-blocking read."""

    node: str
    view: Callable[[], tuple[Sequence[devices.DeviceGroup], Sequence[devices.MonitorSample]]]
    nvml_errors: Callable[[], Mapping[str, int]]
    outbox_depth: Callable[[], int]
    registrations: Callable[[], int]


class AgentMetrics:
    """The agent's own counters and histograms on ``registry`` (one instance per registry).

    The scrape-time families (per accelerator, NVML errors, outbox depth, registrations) read
    the observer, which writes these: :func:`register_view` adds them once it exists.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.detection_seconds = Histogram(
            "gpustack_agent_detection_pass_seconds",
            "Duration of one detection pass.",
            buckets=_PASS_BUCKETS,
            registry=registry,
        )
        self.monitor_seconds = Histogram(
            "gpustack_agent_monitor_pass_seconds",
            "Duration of one monitor (sampling) pass.",
            buckets=_PASS_BUCKETS,
            registry=registry,
        )
        self.pass_failures = Counter(
            "gpustack_agent_pass_failures",
            "Detection or monitor passes that failed for a manufacturer.",
            ["manufacturer"],
            registry=registry,
        )


def register_view(registry: CollectorRegistry, sources: Sources) -> None:
    """Produce the scrape-time families from ``sources`` on ``registry`` (once per registry)."""
    registry.register(_Collector(sources))


class _Collector(Collector):
    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def describe(self) -> list[Metric]:
        return []  # dynamic families: never checked for collisions at registration

    def collect(self) -> Iterator[Metric]:
        yield from accelerator_families(self.sources.node, *self.sources.view())
        errors = CounterMetricFamily(
            "gpustack_agent_nvml_errors", "NVML calls that failed, by function.", labels=["call"]
        )
        for call, count in sorted(self.sources.nvml_errors().items()):
            errors.add_metric([call], count)
        yield errors
        yield GaugeMetricFamily(
            "gpustack_bus_outbox_depth",
            "Events waiting to be stored by the bus.",
            value=self.sources.outbox_depth(),
        )
        yield CounterMetricFamily(
            "gpustack_agent_kubelet_registrations",
            "Successful registrations with kubelet (all resources, all generations).",
            value=self.sources.registrations(),
        )


def accelerator_families(
    node: str,
    groups: Sequence[devices.DeviceGroup],
    samples: Sequence[devices.MonitorSample],
) -> list[GaugeMetricFamily]:
    """The per-accelerator gauges for the latest view (pure; see the module docstring)."""
    labels = {a.id: _labels(node, g, a) for g in groups for a in g.accelerators}
    families = [
        GaugeMetricFamily(f"gpustack_accelerator_{name}", text, labels=LABELS)
        for name, text, _ in _GAUGES
    ]
    for sample in samples:
        for accelerator in sample.accelerators:
            values = labels.get(accelerator.id)
            if values is None:
                continue  # sampled before detection named it: wait for the next pass
            for family, (_, _, read) in zip(families, _GAUGES, strict=True):
                value = read(accelerator)
                if value is not None:
                    family.add_metric(values, float(value))
    return families


def _labels(node: str, group: devices.DeviceGroup, accelerator: devices.Accelerator) -> list[str]:
    indexes = accelerator.physical_indexes or ()
    prefix = "nvidia" if group.manufacturer == "nvidia" else "card"
    device = f"{prefix}{indexes[0]}" if indexes else ""
    bus_id = accelerator.topology.pci_bus_id if accelerator.topology else None
    return [
        str(accelerator.index),
        accelerator.id,
        device,
        group.name,
        node,
        bus_id or "",
        group.manufacturer,
    ]

"""The device agent's Prometheus metrics: per-accelerator series and the agent's own health.

Per-accelerator series are produced at scrape time from the latest detection and monitor pass
(a custom collector), so a card that disappears takes its series with it and a value the
hardware did not report is absent, never ``0``. Their labels are those of NVIDIA's DCGM exporter,
so a Grafana dashboard written for DCGM is adapted by renaming the metrics only; docs/metrics.md
maps every series to its DCGM field (:data:`SERIES` is the list).

Labels on every accelerator series: ``gpu`` (the index within its manufacturer), ``UUID`` (the
accelerator id), ``device`` (``nvidia<minor>``, ``card<N>`` for AMD), ``modelName``, ``Hostname``
(the node name; DCGM's newest releases spell it ``hostname``), ``pci_bus_id``,
``DCGM_FI_DRIVER_VERSION``, ``manufacturer`` (DCGM has none; dashboards may ignore it), the
container holding the card (``pod``, ``namespace``, ``container``: from the device plugins'
ledger, which kubelet's pod-resources API keeps current; a card several containers hold has
one series per container, each with the card's value), and for a MIG instance ``GPU_I_ID`` and
``GPU_I_PROFILE`` (the instance's own memory and GPM activity series; the card's series leave
them empty). A label nobody reported is the empty string, which Prometheus treats as absent.

The GPM activity ratios (``gr_engine_active``, ``sm_active``, ``sm_occupancy``,
``dram_active``, ``tensor_active``: DCGM's ``DCGM_FI_PROF_*`` profiling fields) are the only
activity figures a card in MIG mode has; they need two monitor passes, so the first scrape after a start has none.

Agent health: ``gpustack_agent_detection_pass_seconds`` and
``gpustack_agent_monitor_pass_seconds`` (histograms), ``gpustack_agent_pass_failures_total``
(by manufacturer), ``gpustack_agent_nvml_errors_total`` (by NVML ``call``),
``gpustack_bus_outbox_depth`` and ``gpustack_bus_outbox_dropped_events_total`` (the latter from
:class:`bus.metrics.BusMetrics`), ``gpustack_agent_kubelet_registrations_total``.

No ``_created`` series anywhere (:mod:`kit.serving` turns them off): DCGM has none, and they
double the series count of every counter.

Names (``dm serve --metrics-names``): ``gpustack`` (the default) names every accelerator series
``gpustack_accelerator_*``; ``dcgm`` names each series that has a DCGM field by that field
(:data:`DCGM_FIELDS`: ``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED``, ...), so a dashboard
written for dcgm-exporter reads it unchanged, and keeps ours for the few DCGM has no field for
(``unhealthy``, ``nvlink_links_up``, the NVLink byte counters); ``both`` exposes
each DCGM-named series under both names. The units are already DCGM's (MiB, percent, degrees
Celsius, watts, MHz, millijoules, ratios 0-1), so only the name changes. dcgm-exporter types its
counters ``counter`` with no ``_total`` suffix, which prometheus_client's text writer cannot
write (it adds ``_total`` to a counter's TYPE line): the DCGM-named counters are untyped, with
DCGM's exact sample name; PromQL's ``rate`` and ``increase`` read them the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bus import devices

NAMINGS = ("gpustack", "dcgm", "both")
"""``--metrics-names``: whose names the per-accelerator series carry (module docstring)."""

LABELS = (
    "gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION",
    "manufacturer", "pod", "namespace", "container", "GPU_I_ID", "GPU_I_PROFILE",
)  # fmt: skip

Reader = Callable[[devices.AcceleratorSample], float | None]


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Series:
    """One per-accelerator family: ``gpustack_accelerator_<name>`` (``_total`` for counters)."""

    name: str
    help: str
    read: Reader
    counter: bool = False


SERIES: tuple[Series, ...] = (
    Series("memory_total_mib", "Memory of the accelerator, driver-reserved included, MiB.",
           lambda s: s.memory),
    Series("memory_used_mib", "Memory in use, MiB.", lambda s: s.memory_usage),
    Series("memory_free_mib", "Memory free, MiB.", lambda s: s.memory_free),
    Series("memory_reserved_mib", "Memory the driver reserved, MiB.", lambda s: s.memory_reserved),
    Series("utilization_percent", "Core utilization, percent.", lambda s: s.cores_utilization),
    Series("memory_copy_utilization_percent", "Time memory was read or written, percent.",
           lambda s: s.memory_copy_utilization),
    Series("encoder_utilization_percent", "Video encoder utilization, percent.",
           lambda s: s.encoder_utilization),
    Series("decoder_utilization_percent", "Video decoder utilization, percent.",
           lambda s: s.decoder_utilization),
    Series("temperature_celsius", "Core temperature, degrees Celsius.", lambda s: s.temperature),
    Series("memory_temperature_celsius", "Memory temperature, degrees Celsius.",
           lambda s: s.memory_temperature),
    Series("power_watts", "Power drawn, watts.", lambda s: s.power_usage),
    Series("sm_clock_mhz", "SM clock, MHz.", lambda s: s.sm_clock),
    Series("memory_clock_mhz", "Memory clock, MHz.", lambda s: s.memory_clock),
    Series("energy_millijoules", "Energy consumed since the driver loaded, millijoules.",
           lambda s: s.energy, counter=True),
    Series("pcie_tx_kilobytes_per_second", "PCIe data sent, KB/s.", lambda s: s.pcie_tx_throughput),
    Series("pcie_rx_kilobytes_per_second", "PCIe data received, KB/s.",
           lambda s: s.pcie_rx_throughput),
    Series("pcie_replays", "PCIe replays since the driver loaded.", lambda s: s.pcie_replays,
           counter=True),
    Series("remapped_rows_correctable", "Memory rows remapped for correctable errors.",
           lambda s: s.remapped_rows_correctable, counter=True),
    Series("remapped_rows_uncorrectable", "Memory rows remapped for uncorrectable errors.",
           lambda s: s.remapped_rows_uncorrectable, counter=True),
    Series("row_remap_failure", "1 when a row remapping failed.", lambda s: _flag(s.row_remap_failed)),
    Series("retired_pages_single_bit", "Pages retired for repeated single-bit ECC errors.",
           lambda s: s.retired_pages_single_bit, counter=True),
    Series("retired_pages_double_bit", "Pages retired for double-bit ECC errors.",
           lambda s: s.retired_pages_double_bit, counter=True),
    Series("nvlink_links_up", "NVLink links up.", lambda s: s.nvlink_links),
    Series("nvlink_tx_kibibytes", "NVLink data sent since the driver loaded, KiB.",
           lambda s: s.nvlink_tx, counter=True),
    Series("nvlink_rx_kibibytes", "NVLink data received since the driver loaded, KiB.",
           lambda s: s.nvlink_rx, counter=True),
    Series("unhealthy", "1 when the accelerator is Unhealthy.", lambda s: float(s.unhealthy)),
    Series("gr_engine_active", "Ratio of time the graphics/compute engine was busy (GPM).",
           lambda s: s.gr_engine_active),
    Series("sm_active", "Ratio of SMs busy over the interval (GPM).", lambda s: s.sm_active),
    Series("sm_occupancy", "Ratio of resident warps to the SMs' maximum (GPM).",
           lambda s: s.sm_occupancy),
    Series("dram_active", "Ratio of the peak DRAM bandwidth used (GPM).",
           lambda s: s.dram_active),
    Series("tensor_active", "Ratio of the tensor pipes' peak used over the interval (GPM).",
           lambda s: s.tensor_active),
)  # fmt: skip
DCGM_FIELDS: Mapping[str, str] = {
    "memory_total_mib": "DCGM_FI_DEV_FB_TOTAL",
    "memory_used_mib": "DCGM_FI_DEV_FB_USED",
    "memory_free_mib": "DCGM_FI_DEV_FB_FREE",
    "memory_reserved_mib": "DCGM_FI_DEV_FB_RESERVED",
    "utilization_percent": "DCGM_FI_DEV_GPU_UTIL",
    "memory_copy_utilization_percent": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "encoder_utilization_percent": "DCGM_FI_DEV_ENC_UTIL",
    "decoder_utilization_percent": "DCGM_FI_DEV_DEC_UTIL",
    "temperature_celsius": "DCGM_FI_DEV_GPU_TEMP",
    "memory_temperature_celsius": "DCGM_FI_DEV_MEMORY_TEMP",
    "power_watts": "DCGM_FI_DEV_POWER_USAGE",
    "sm_clock_mhz": "DCGM_FI_DEV_SM_CLOCK",
    "memory_clock_mhz": "DCGM_FI_DEV_MEM_CLOCK",
    "energy_millijoules": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "pcie_tx_kilobytes_per_second": "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "pcie_rx_kilobytes_per_second": "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "pcie_replays": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "remapped_rows_correctable": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "remapped_rows_uncorrectable": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "row_remap_failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "retired_pages_single_bit": "DCGM_FI_DEV_RETIRED_SBE",
    "retired_pages_double_bit": "DCGM_FI_DEV_RETIRED_DBE",
    "gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "last_xid": "DCGM_FI_DEV_XID_ERRORS",
}
"""Our series name -> the DCGM field of the same quantity in the same unit (DCGM's own field
names, as dcgm-exporter exports them). Series not here have no DCGM field and keep our name."""
LAST_XID = "gpustack_accelerator_last_xid"
"""The last XID each card reported since the agent started (0: none), as DCGM_FI_DEV_XID_ERRORS."""
MigReader = Callable[[devices.MigInstanceSample], float | None]
_MIG_SERIES: tuple[tuple[str, MigReader], ...] = (
    ("memory_total_mib", lambda m: m.memory),
    ("memory_used_mib", lambda m: m.memory_usage),
)
"""A MIG device's own series (one per MIG device, GPU_I_ID and GPU_I_PROFILE set)."""
_GI_SERIES: tuple[tuple[str, MigReader], ...] = (
    ("gr_engine_active", lambda m: m.gr_engine_active),
    ("sm_active", lambda m: m.sm_active),
    ("sm_occupancy", lambda m: m.sm_occupancy),
    ("dram_active", lambda m: m.dram_active),
    ("tensor_active", lambda m: m.tensor_active),
)
"""A GPU instance's activity: one series per GI (its compute instances share the figure)."""

_PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


Holder = tuple[str, str, str]
"""``(namespace, pod, container)`` of a container holding a card."""


@dataclass
class Sources:
    """Where the scrape-time values come from; each is a cheap, non-blocking read."""

    node: str
    view: Callable[[], tuple[Sequence[devices.DeviceGroup], Sequence[devices.MonitorSample]]]
    nvml_errors: Callable[[], Mapping[str, int]]
    outbox_depth: Callable[[], int]
    registrations: Callable[[], int]
    holders: Callable[[], Mapping[str, Sequence[Holder]]] = dict
    """Accelerator id -> the containers holding it now."""
    xids: Callable[[], Mapping[str, int]] = dict
    """Accelerator id -> the last XID it reported."""
    naming: str = "gpustack"
    """One of :data:`NAMINGS` (``--metrics-names``)."""


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
        src = self.sources
        yield from accelerator_families(
            src.node, *src.view(), holders=src.holders(), xids=src.xids(), naming=src.naming
        )
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
    *,
    holders: Mapping[str, Sequence[Holder]] | None = None,
    xids: Mapping[str, int] | None = None,
    naming: str = "gpustack",
) -> list[Metric]:
    """The per-accelerator families for the latest view (pure; see the module docstring).

    ``naming`` is one of :data:`NAMINGS`; each family of a series gets the same samples.
    """
    labels = {a.id: _labels(node, g, a) for g in groups for a in g.accelerators}
    families = {s.name: _families_for(s, naming) for s in SERIES}
    last_xid = _families_for(_XID_SERIES, naming)
    for sample in samples:
        for accelerator in sample.accelerators:
            card = labels.get(accelerator.id)
            if card is None:
                continue  # sampled before detection named it: wait for the next pass
            held = (holders or {}).get(accelerator.id) or [("", "", "")]
            for holder in sorted(held):
                values = [*card, holder[1], holder[0], holder[2], "", ""]
                _add(families, accelerator, values)
                _put(last_xid, values, float((xids or {}).get(accelerator.id, 0)))
            instances: set[int] = set()
            for mig in accelerator.mig_instances or ():
                values = [*card, "", "", "", str(mig.gpu_instance_id), mig.profile or ""]
                _add_mig(families, mig, values, _MIG_SERIES)
                if mig.gpu_instance_id not in instances:
                    instances.add(mig.gpu_instance_id)
                    _add_mig(families, mig, values, _GI_SERIES)
    return [f for fs in (*families.values(), last_xid) for f in fs]


_XID_SERIES = Series(
    "last_xid", "The last XID the accelerator reported (0: none since the agent started).",
    lambda s: None,
)  # fmt: skip
"""Only its names and help: its value comes from the XID watcher, not the sample."""


def _families_for(series: Series, naming: str) -> list[Metric]:
    """The families one series is exposed as under ``naming`` (ours, DCGM's, or both)."""
    ours = f"gpustack_accelerator_{series.name}"
    dcgm = DCGM_FIELDS.get(series.name)
    out: list[Metric] = []
    if naming != "dcgm" or dcgm is None:
        kind = CounterMetricFamily if series.counter else GaugeMetricFamily
        out.append(kind(ours, series.help, labels=LABELS))
    if naming != "gpustack" and dcgm is not None:
        out.append(_DcgmFamily(dcgm, series.help, "unknown" if series.counter else "gauge"))
    return out


class _DcgmFamily(Metric):
    """A family whose one sample name is the family's (DCGM's exact name, never ``_total``)."""

    def add_metric(self, values: Sequence[str], value: float) -> None:
        self.add_sample(self.name, dict(zip(LABELS, values, strict=True)), value)


def _put(families: Sequence[Metric], values: list[str], value: float) -> None:
    for family in families:
        family.add_metric(values, value)  # type: ignore[attr-defined]


def _add(
    families: Mapping[str, Sequence[Metric]],
    sample: devices.AcceleratorSample,
    values: list[str],
) -> None:
    for series in SERIES:
        value = series.read(sample)
        if value is not None:
            _put(families[series.name], values, float(value))


def _add_mig(
    families: Mapping[str, Sequence[Metric]],
    mig: devices.MigInstanceSample,
    values: list[str],
    series: tuple[tuple[str, MigReader], ...],
) -> None:
    """A MIG instance's own values, on the card's families with GPU_I_ID and GPU_I_PROFILE."""
    for name, read in series:
        value = read(mig)
        if value is not None:
            _put(families[name], values, float(value))


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
        group.driver_version or "",
        group.manufacturer,
    ]

"""The per-accelerator families, pure: labels, holders, MIG instances, counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from agent.serve import metrics
from bus import devices

_ID = "GPU-0"


def _view(**sample: object) -> tuple[list[devices.DeviceGroup], list[devices.MonitorSample]]:
    card = devices.Accelerator(
        id=_ID, index=0, physical_indexes=(4,), status=devices.AcceleratorStatus(unhealthy=False),
        topology=devices.Topology(pci_bus_id="0000:18:00.0"),
    )  # fmt: skip
    group = devices.DeviceGroup(id="nvidia-h100", manufacturer="nvidia", name="NVIDIA H100",
                                driver_version="580.82.07", accelerators=(card,))  # fmt: skip
    values = devices.AcceleratorSample(id=_ID, unhealthy=False, **sample)  # type: ignore[arg-type]
    return [group], [
        devices.MonitorSample(manufacturer="nvidia", timestamp="t", accelerators=(values,))
    ]


def _scrape(families: list[Metric]) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()

    class Fixed:
        def collect(self) -> list[Metric]:
            return families

    registry.register(Fixed())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def test_card_labels_are_dcgm_exporters_and_absent_values_make_no_series() -> None:
    got = _scrape(metrics.accelerator_families("node-1", *_view(memory=81559, sm_clock=1980)))
    ((labels, value),) = got["gpustack_accelerator_memory_total_mib"]
    assert value == 81559
    assert labels == {
        "gpu": "0", "UUID": _ID, "device": "nvidia4", "modelName": "NVIDIA H100",
        "Hostname": "node-1", "pci_bus_id": "0000:18:00.0", "DCGM_FI_DRIVER_VERSION": "580.82.07",
        "manufacturer": "nvidia", "pod": "", "namespace": "", "container": "", "GPU_I_ID": "",
        "GPU_I_PROFILE": "",
    }  # fmt: skip
    assert got["gpustack_accelerator_sm_clock_mhz"][0][1] == 1980
    assert got["gpustack_accelerator_utilization_percent"] == []  # not reported: no series, no 0
    assert got["gpustack_accelerator_last_xid"][0][1] == 0


def test_each_holding_container_gets_the_cards_series() -> None:
    holders = {_ID: [("ai", "b", "main"), ("ai", "a", "main")]}
    got = _scrape(
        metrics.accelerator_families("n", *_view(temperature=40), holders=holders, xids={_ID: 79})
    )
    temps = got["gpustack_accelerator_temperature_celsius"]
    assert [(labels["pod"], value) for labels, value in temps] == [("a", 40.0), ("b", 40.0)]
    assert {v for _, v in got["gpustack_accelerator_last_xid"]} == {79.0}


def test_mig_instances_have_their_own_memory_series() -> None:
    instances = (
        devices.MigInstanceSample(uuid="MIG-a", gpu_instance_id=7, profile="1g.10gb", memory=9984,
                                  memory_usage=100),
        devices.MigInstanceSample(uuid="MIG-b", gpu_instance_id=1, profile="3g.40gb", memory=40448),
    )  # fmt: skip
    got = _scrape(metrics.accelerator_families("n", *_view(memory=81559, mig_instances=instances)))
    total = {
        (l["GPU_I_ID"], l["GPU_I_PROFILE"]): v
        for l, v in got["gpustack_accelerator_memory_total_mib"]
    }
    assert total == {("", ""): 81559, ("7", "1g.10gb"): 9984, ("1", "3g.40gb"): 40448}
    used = {l["GPU_I_ID"]: v for l, v in got["gpustack_accelerator_memory_used_mib"]}
    assert used == {"7": 100}
    assert all(l["UUID"] == _ID for l, _ in got["gpustack_accelerator_memory_total_mib"])


def test_counters_are_counters() -> None:
    got = _scrape(metrics.accelerator_families("n", *_view(energy=5, pcie_replays=2, nvlink_tx=7)))
    assert got["gpustack_accelerator_energy_millijoules"][0][1] == 5
    names = {s.type for f in metrics.accelerator_families("n", *_view()) for s in [f]}
    assert "counter" in names
    assert {s.name for s in metrics.SERIES if s.counter} >= {"energy_millijoules", "pcie_replays",
        "remapped_rows_correctable", "remapped_rows_uncorrectable", "nvlink_tx_kibibytes"}  # fmt: skip

"""The Devices and monitor wire shapes, and how they render as YAML and JSON."""

from __future__ import annotations

import json

import msgspec
import pytest
import yaml

from bus import devices
from kit import rendering


def _accelerator(index: int) -> devices.Accelerator:
    return devices.Accelerator(
        id=f"GPU-{index}",
        index=index,
        physical_indexes=(1, 128),
        topology=devices.Topology(
            pci_bus_id="0000:04:00.0", numa_affinity="0", cpu_affinity="0-13"
        ),
        status=devices.AcceleratorStatus(
            unhealthy=False,
            logical_sliced=devices.LogicalSliced(cores_percentage_overcommit=True, count=128),
        ),
    )


def _group(**overrides: object) -> devices.DeviceGroup:
    fields: dict[str, object] = {
        "id": "radeon-rx-7800-xt",
        "manufacturer": "amd",
        "name": "AMD Radeon RX 7800 XT",
        "memory": 16368,
        "cores": 60,
        "driver_version": "6.16.13",
        "runtime_version": "7.2",
        "compute_capability": "gfx1101",
        "family": "GC 11.0.0",
        "accelerators": (_accelerator(0),),
    }
    fields.update(overrides)
    return devices.DeviceGroup(**fields)  # type: ignore[arg-type]


def _plain(document: object) -> object:
    return json.loads(msgspec.json.encode(document))


def test_camel_case_order_and_omitted_fields() -> None:
    group = _group(cores=None, runtime_version=None)
    wire = msgspec.to_builtins(group)
    assert list(wire) == [
        "id",
        "manufacturer",
        "name",
        "memory",
        "driverVersion",
        "computeCapability",
        "family",
        "accelerators",
    ]
    accelerator = wire["accelerators"][0]
    assert list(accelerator) == ["id", "index", "physicalIndexes", "topology", "status"]
    assert accelerator["status"] == {
        "unhealthy": False,
        "logicalSliced": {"coresPercentageOvercommit": True, "count": 128},
    }


def test_unhealthy_false_is_never_omitted() -> None:
    sample = devices.AcceleratorSample(id="GPU-1", unhealthy=False)
    assert msgspec.to_builtins(sample) == {"id": "GPU-1", "unhealthy": False}


def test_simulated_mark_appears_only_when_true() -> None:
    assert "simulated" not in msgspec.to_builtins(_group())
    assert msgspec.to_builtins(_group(simulated=True))["simulated"] is True


@pytest.mark.parametrize(
    ("manufacturer", "name", "expected"),
    [
        ("nvidia", "NVIDIA H200", "nvidia-h200"),
        ("nvidia", "NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
        ("amd", "AMD Radeon RX 7800 XT", "radeon-rx-7800-xt"),
        ("amd", "AMD Instinct MI300X", "instinct-mi300x"),
        ("nvidia", "  ", "nvidia"),
    ],
)
def test_group_id(manufacturer: str, name: str, expected: str) -> None:
    assert devices.group_id(manufacturer, name) == expected


def test_canonical_order() -> None:
    later = _group(id="b", manufacturer="nvidia", accelerators=(_accelerator(3), _accelerator(1)))
    first = _group(id="a", manufacturer="nvidia", accelerators=(_accelerator(0),))
    amd = _group(accelerators=(_accelerator(5),))
    ordered = devices.canonical_groups([later, first, amd])
    assert [g.id for g in ordered] == ["radeon-rx-7800-xt", "a", "b"]
    assert [a.index for a in ordered[2].accelerators] == [1, 3]


def test_yaml_round_trips_and_quotes_what_yaml_would_retype() -> None:
    text = rendering.render([_group()], "yaml")
    assert yaml.safe_load(text) == _plain([_group()])
    assert "runtimeVersion: '7.2'" in text
    assert "\n  accelerators:\n    - id: GPU-0\n" in text, "sequences are indented under keys"


def test_json_is_pure_json() -> None:
    text = rendering.render([_group()], "json")
    assert json.loads(text) == _plain([_group()])
    assert text.endswith("}\n]\n")


def test_empty_documents() -> None:
    assert rendering.render([], "yaml") == "[]\n"
    assert json.loads(rendering.render([], "json")) == []


def test_wire_decoding_is_strict_about_types() -> None:
    raw = msgspec.json.encode(_group())
    assert msgspec.json.decode(raw, type=devices.DeviceGroup) == _group()
    broken = raw.replace(b'"memory":16368', b'"memory":"lots"')
    with pytest.raises(msgspec.ValidationError, match="memory"):
        msgspec.json.decode(broken, type=devices.DeviceGroup)


def test_disambiguated_ids_suffix_only_shared_bases() -> None:
    keys = [("mi300x", 196592), ("mi300x", 262128), ("h200", 143771), ("mi300x", None)]
    assert devices.disambiguated_ids(keys) == {
        ("mi300x", 196592): "mi300x-192g",
        ("mi300x", 262128): "mi300x-256g",
        ("h200", 143771): "h200",
        ("mi300x", None): "mi300x",
    }

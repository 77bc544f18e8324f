from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nvidia_helpers import rig

from agent.devices import nvidia_facts
from agent.devices.libs.nvml import GpuInstanceProfile
from agent.errors import DetectionError
from bus import devices

# -- pure derivations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "per_sm"),
    [((3, 5), 192), ((5, 2), 128), ((6, 0), 64), ((6, 1), 128), ((7, 0), 64), ((7, 5), 64),
     ((8, 0), 64), ((8, 6), 128), ((8, 7), 128), ((8, 9), 128), ((9, 0), 128), ((10, 0), 128),
     ((12, 0), 128), ((2, 1), None)],
)  # fmt: skip
def test_cores_per_sm(capability: tuple[int, int], per_sm: int | None) -> None:
    assert nvidia_facts.cores_per_sm(capability) == per_sm


def test_streaming_multiprocessors() -> None:
    assert nvidia_facts.streaming_multiprocessors(16896, (9, 0)) == 132  # H100/H200
    assert nvidia_facts.streaming_multiprocessors(6912, (8, 0)) == 108  # A100
    assert nvidia_facts.streaming_multiprocessors(16384, (8, 9)) == 128  # RTX 4090
    assert nvidia_facts.streaming_multiprocessors(100, (9, 0)) is None  # not a whole number of SMs
    assert nvidia_facts.streaming_multiprocessors(None, (9, 0)) is None
    assert nvidia_facts.streaming_multiprocessors(16896, None) is None


@pytest.mark.parametrize(("value", "text"), [(12080, "12.8"), (13000, "13.0"), (11040, "11.4"),
                                             (12020, "12.2")])  # fmt: skip
def test_runtime_version(value: int, text: str) -> None:
    assert nvidia_facts.runtime_version(value) == text


@pytest.mark.parametrize(("arch", "family"), [(2, "Kepler"), (3, "Maxwell"), (4, "Pascal"),
    (5, "Volta"), (6, "Turing"), (7, "Ampere"), (8, "Ada Lovelace"), (9, "Hopper"),
    (10, "Blackwell"), (0xFFFFFFFF, None), (None, None)])  # fmt: skip
def test_family_from_architecture(arch: int | None, family: str | None) -> None:
    assert nvidia_facts.family_from_architecture(arch) == family


@pytest.mark.parametrize(("cc", "family"), [((7, 0), "Volta"), ((7, 2), "Volta"),
    ((7, 5), "Turing"), ((8, 0), "Ampere"), ((8, 6), "Ampere"), ((8, 7), "Ampere"),
    ((8, 9), "Ada Lovelace"), ((9, 0), "Hopper"), ((10, 0), "Blackwell"), ((12, 0), "Blackwell"),
    ((1, 0), None), (None, None)])  # fmt: skip
def test_family_from_capability(cc: tuple[int, int] | None, family: str | None) -> None:
    assert nvidia_facts.family_from_capability(cc) == family


def _profile(name: str, placements: tuple[tuple[int, int], ...]) -> GpuInstanceProfile:
    return GpuInstanceProfile(0, name, 18176, 1, 7, 16, placements)


def test_slice_profiles_drop_unnamable_and_unplaceable_profiles() -> None:
    kept = nvidia_facts.slice_profiles(
        (
            _profile("1g.18gb", ((0, 1), (1, 1))),
            _profile("1g.18gb+me", ((0, 1),)),
            _profile("1g.35gb", ()),
            _profile("1g.18gb+me.all", ((0, 1),)),
        )
    )
    assert kept == (
        devices.SliceProfile(
            name="1g.18gb", memory_mib=18176, compute_slices=1, memory_slices=1, count=7
        ),
    )


def test_pct_rounds_half_up() -> None:
    assert (nvidia_facts.pct(1, 200), nvidia_facts.pct(1, 201), nvidia_facts.pct(0, 5), nvidia_facts.pct(5, 0)) == (
        1, 0, 0, None,
    )  # fmt: skip


# -- the full h200x8 pass -----------------------------------------------------------------------

_H200 = [  # uuid suffix, bus, bridges outermost first, numa, cpus (from nvidia-h200x8.yaml)
    ("60", "0000:18:00.0", ("0000:16:00.0", "0000:17:00.0"), "0", "0-47,96-143"),
    ("61", "0000:2a:00.0", ("0000:28:00.0", "0000:29:00.0"), "0", "0-47,96-143"),
    ("62", "0000:3a:00.0", ("0000:38:00.0", "0000:39:00.0"), "0", "0-47,96-143"),
    ("63", "0000:5d:00.0", ("0000:5b:00.0", "0000:5c:00.0"), "0", "0-47,96-143"),
    ("64", "0000:9a:00.0", ("0000:98:00.0", "0000:99:00.0"), "1", "48-95,144-191"),
    ("65", "0000:ab:00.0", ("0000:a9:00.0", "0000:aa:00.0"), "1", "48-95,144-191"),
    ("66", "0000:ba:00.0", ("0000:b8:00.0", "0000:b9:00.0"), "1", "48-95,144-191"),
    ("67", "0000:db:00.0", ("0000:d9:00.0", "0000:da:00.0"), "1", "48-95,144-191"),
]
_UUID = "GPU-6f1c2b9e-3a47-5d81-9c0e-1b2a3c4d5e"
_LOGICAL = {"coresPercentageOvercommit": True, "count": 128}


def _h200_expected() -> list[dict[str, Any]]:
    accelerators = [
        {
            "id": _UUID + suffix,
            "index": i,
            "physicalIndexes": [i],
            "topology": {
                "pciBusId": bus,
                "pciRootId": bridges[0],
                "pciSwitches": [bridges[1], bridges[0]],
                "numaAffinity": numa,
                "cpuAffinity": cpus,
            },
            "status": {"unhealthy": False, "logicalSliced": _LOGICAL},
        }
        for i, (suffix, bus, bridges, numa, cpus) in enumerate(_H200)
    ]
    return [
        {
            "id": "nvidia-h200",
            "manufacturer": "nvidia",
            "name": "NVIDIA H200",
            "memory": 143771,
            "cores": 132,
            "driverVersion": "570.124.06",
            "runtimeVersion": "12.8",
            "computeCapability": "9.0",
            "family": "Hopper",
            "simulated": True,
            "accelerators": accelerators,
        }
    ]


def _wire(groups: list[devices.DeviceGroup]) -> list[dict[str, Any]]:
    return msgspec.json.decode(msgspec.json.encode(devices.canonical_groups(groups)))


def test_h200x8_detect_output(tmp_path: Path) -> None:
    r = rig(tmp_path)
    assert _wire(r.backend.detect()) == _h200_expected()
    assert r.sim.refcount == 0  # the pass's session was closed
    # sysfs answered locality, so NVML's affinity masks were never asked for
    assert not [c for c in r.sim.calls if "Affinity" in c[0]]


def test_h100_mig_detect_shows_both_modes(tmp_path: Path) -> None:
    groups = _wire(rig(tmp_path, "nvidia-h100x8-mig").backend.detect())
    assert [g["id"] for g in groups] == ["nvidia-h100-80gb-hbm3"]
    (group,) = groups
    assert (group["memory"], group["cores"], group["runtimeVersion"]) == (81559, 132, "13.0")
    mig_card, full_card = group["accelerators"][3], group["accelerators"][4]
    assert mig_card["status"] == {
        "unhealthy": False,
        "physicalSliced": {
            "profiles": [
                {"name": "1g.10gb", "memoryMib": 9984, "computeSlices": 1, "memorySlices": 1,
                 "count": 7},
                {"name": "2g.20gb", "memoryMib": 20096, "computeSlices": 2, "memorySlices": 2,
                 "count": 3},
                {"name": "3g.40gb", "memoryMib": 40448, "computeSlices": 3, "memorySlices": 4,
                 "count": 2},
                {"name": "4g.40gb", "memoryMib": 40448, "computeSlices": 4, "memorySlices": 4,
                 "count": 1},
                {"name": "7g.80gb", "memoryMib": 81152, "computeSlices": 7, "memorySlices": 8,
                 "count": 1},
                {"name": "1g.20gb", "memoryMib": 20096, "computeSlices": 1, "memorySlices": 2,
                 "count": 4},
            ],
            "count": 7,
        },
    }  # fmt: skip
    assert full_card["status"] == {"unhealthy": False, "logicalSliced": _LOGICAL}
    assert full_card["topology"]["numaAffinity"] == "1"


def test_locality_falls_back_to_nvml_without_sysfs(tmp_path: Path) -> None:
    groups = _wire(rig(tmp_path, with_sysfs=False, pci_check=False).backend.detect())
    topology = groups[0]["accelerators"][5]["topology"]
    assert topology == {
        "pciBusId": "0000:ab:00.0",
        "numaAffinity": "1",
        "cpuAffinity": "48-95,144-191",
    }


# -- the PCI check ------------------------------------------------------------------------------


def test_no_nvidia_pci_device_means_no_nvml_call(tmp_path: Path) -> None:
    r = rig(tmp_path, with_sysfs=False)
    assert r.backend.detect() == []
    assert r.backend.sample() == []
    assert r.sim.calls == []


def test_cards_on_the_bus_but_nvml_init_failing_is_a_detection_error(tmp_path: Path) -> None:
    r = rig(tmp_path, init_error="DRIVER_NOT_LOADED")
    with pytest.raises(DetectionError) as info:
        r.backend.detect()
    assert str(info.value) == (
        "nvidia: 8 NVIDIA PCI devices found but NVML failed to initialise: Driver Not Loaded"
    )
    with pytest.raises(DetectionError, match="8 NVIDIA PCI devices"):
        r.backend.sample()


def test_without_pci_check_an_absent_library_means_no_nvidia(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(tmp_path, with_sysfs=False, pci_check=False, init_error="LIBRARY_NOT_FOUND")
    with caplog.at_level(logging.INFO):
        assert r.backend.detect() == []
    assert "NVML is not available" in caplog.text
    r = rig(tmp_path, with_sysfs=False, pci_check=False, init_error="UNKNOWN")
    with pytest.raises(DetectionError, match="NVML failed to initialise: Unknown Error"):
        r.backend.detect()


def test_a_failed_init_is_retried_on_the_next_pass(tmp_path: Path) -> None:
    r = rig(tmp_path, init_error="DRIVER_NOT_LOADED")
    with pytest.raises(DetectionError):
        r.backend.detect()
    assert r.sim.host is not None
    r.sim.host = msgspec.structs.replace(r.sim.host, init_error=None)  # the driver loaded
    assert len(_wire(r.backend.detect())[0]["accelerators"]) == 8


# -- the failure matrix: every NVML call on card 3 x every error class ---------------------------

CARD_CALLS = [  # in the order the backend makes them, as the "lost" column relies on
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetNumGpuCores",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstancePossiblePlacements",
    "nvmlDeviceGetMemoryAffinity",
    "nvmlDeviceGetCpuAffinity",
]
ERRORS = ["NOT_SUPPORTED", "NO_PERMISSION", "FUNCTION_NOT_FOUND", "GPU_IS_LOST", "UNKNOWN"]
_IDENTITY = CARD_CALLS[:2]
_GROUP_FIELDS = {  # the group-level figures a call feeds
    "nvmlDeviceGetName": set(),
    "nvmlDeviceGetMemoryInfo": {"memory"},
    "nvmlDeviceGetNumGpuCores": {"cores"},
    "nvmlDeviceGetCudaComputeCapability": {"cores", "computeCapability"},
    "nvmlDeviceGetArchitecture": set(),  # the family still follows from the capability
}


def _matrix_rig(tmp_path: Path, faults: dict[int, dict[str, str]] | None = None) -> Any:
    # No sysfs tree, so locality comes from NVML and every call above is made.
    return rig(tmp_path, "nvidia-h100x8-mig", faults=faults, with_sysfs=False, pci_check=False)


def _drop(acc: dict[str, Any], call: str, lost_group_fields: set[str]) -> None:
    """Apply to card 3's wire form what losing ``call``'s answer costs (written by hand)."""
    topology, status = acc["topology"], acc["status"]
    if call == "nvmlDeviceGetPciInfo":
        del topology["pciBusId"]
    elif call == "nvmlDeviceGetMinorNumber":
        del acc["physicalIndexes"]
    elif call == "nvmlDeviceGetMigMode":  # unknown MIG mode: offered as software slices
        del status["physicalSliced"]
        status["logicalSliced"] = _LOGICAL
    elif call in ("nvmlDeviceGetGpuInstanceProfileInfo",
                  "nvmlDeviceGetGpuInstancePossiblePlacements"):  # fmt: skip
        status.pop("physicalSliced", None)
    elif call == "nvmlDeviceGetMemoryAffinity":
        del topology["numaAffinity"]
    elif call == "nvmlDeviceGetCpuAffinity":
        del topology["cpuAffinity"]
    else:
        lost_group_fields |= _GROUP_FIELDS[call]
    if call == "nvmlDeviceGetArchitecture" and "computeCapability" in lost_group_fields:
        lost_group_fields.add("family")


def _expected(baseline: list[dict[str, Any]], call: str, error: str) -> list[dict[str, Any]]:
    (group,) = msgspec.json.decode(msgspec.json.encode(baseline))
    accelerators = group["accelerators"]
    if call in _IDENTITY:
        del accelerators[3]
        return [group]
    dropped = CARD_CALLS[CARD_CALLS.index(call) :] if error == "GPU_IS_LOST" else [call]
    acc, lost_fields = accelerators[3], set()
    for each in dropped:
        _drop(acc, each, lost_fields)
    if error == "GPU_IS_LOST":
        acc["status"]["unhealthy"] = True
    if not acc["topology"]:
        del acc["topology"]
    if "nvmlDeviceGetName" not in dropped:
        return [group]
    del accelerators[3]
    alone = {k: v for k, v in group.items() if k not in lost_fields}
    alone.update(id="nvidia-gpu", name="NVIDIA GPU", accelerators=[acc])
    return [group, alone]


def test_the_matrix_covers_every_call_the_backend_makes(tmp_path: Path) -> None:
    r = _matrix_rig(tmp_path)
    r.backend.detect()
    made = list(dict.fromkeys(c[0] for c in r.sim.calls if c[1] == 3))
    assert made == CARD_CALLS


@pytest.mark.parametrize("error", ERRORS)
@pytest.mark.parametrize("call", CARD_CALLS)
def test_failure_matrix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, call: str, error: str
) -> None:
    baseline = _wire(_matrix_rig(tmp_path / "baseline").backend.detect())
    r = _matrix_rig(tmp_path / "faulty", {3: {call: error}})
    with caplog.at_level(logging.WARNING):
        got = _wire(r.backend.detect())
    assert got == _expected(baseline, call, error)
    assert r.sim.refcount == 0
    calls_on_3 = [c[0] for c in r.sim.calls if c[1] == 3]
    if error == "GPU_IS_LOST":  # the lost card was not asked anything after the loss
        assert calls_on_3[-1] == call
        assert calls_on_3.count(call) == 1
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    if error in ("GPU_IS_LOST", "UNKNOWN") or call in _IDENTITY:
        assert len(warned) == 1 and "card 3" in warned[0]
        if error == "GPU_IS_LOST" and call not in _IDENTITY:
            assert "GPU-a3e0d1c2-7b65-4f98-8e21-3c4d5e6f7a83" in warned[0]
    else:
        assert warned == []


@pytest.mark.parametrize("error", ERRORS)
@pytest.mark.parametrize(
    ("call", "field"),
    [("nvmlSystemGetDriverVersion", "driverVersion"),
     ("nvmlSystemGetCudaDriverVersion", "runtimeVersion"),
     ("nvmlDeviceGetCount", None)],
)  # fmt: skip
def test_system_call_failures(tmp_path: Path, call: str, field: str | None, error: str) -> None:
    r = rig(tmp_path, system_faults={call: error})
    if field is None or error in ("GPU_IS_LOST", "UNKNOWN"):
        with pytest.raises(DetectionError, match=call):
            r.backend.detect()
    else:
        (group,) = _wire(r.backend.detect())
        assert field not in group
        assert len(group["accelerators"]) == 8
    assert r.sim.refcount == 0


# -- sampling -----------------------------------------------------------------------------------


def _samples(r: Any) -> list[dict[str, Any]]:
    return msgspec.json.decode(msgspec.json.encode(r.backend.sample()))


def test_h200x8_sample_values(tmp_path: Path) -> None:
    r = rig(tmp_path)
    samples = _samples(r)
    assert [s["id"][-2:] for s in samples] == [row[0] for row in _H200]
    assert samples[1] == {  # 71880 of 143771 MiB is 49.996 %; 512345 mW is 512 W
        "id": _UUID + "61",
        "memory": 143771,
        "memoryUsage": 71880,
        "memoryUtilization": 50,
        "coresUtilization": 87,
        "temperature": 58,
        "powerUsage": 512,
        "unhealthy": False,
        # The DCGM default fields (docs/metrics.md): total = free + used + reserved.
        "memoryFree": 143771 - 71880 - 528,
        "memoryReserved": 528,
        "memoryCopyUtilization": 0,
        "encoderUtilization": 0,
        "decoderUtilization": 0,
        "memoryTemperature": 38,
        "smClock": 1980,
        "memoryClock": 3201,
        "energy": 912345678 + 512345,  # one simulated second at 512345 mW
        "pcieTxThroughput": 1200,
        "pcieRxThroughput": 3400,
        "pcieReplays": 0,
        "remappedRowsCorrectable": 0,
        "remappedRowsUncorrectable": 0,
        "rowRemapFailed": False,
        "nvlinkLinks": 18,
        "nvlinkTx": 250000,
        "nvlinkRx": 250000,
    }
    again = _samples(r)[1]  # counters count
    assert (again["energy"], again["nvlinkTx"]) == (912345678 + 2 * 512345, 500000)
    assert (samples[2]["memoryUtilization"], samples[2]["powerUsage"]) == (100, 689)
    assert (samples[3]["memoryUtilization"], samples[3]["memoryUsage"]) == (1, 1024)


def test_mig_cards_sample_without_core_utilization(tmp_path: Path) -> None:
    samples = _samples(rig(tmp_path, "nvidia-h100x8-mig"))
    assert "coresUtilization" not in samples[0]
    assert samples[4]["coresUtilization"] == 55


SAMPLE_CALLS = {
    "nvmlDeviceGetMemoryInfo": (
        "memory", "memoryUsage", "memoryUtilization", "memoryFree", "memoryReserved"
    ),
    "nvmlDeviceGetUtilizationRates": ("coresUtilization", "memoryCopyUtilization"),
    "nvmlDeviceGetTemperature": ("temperature",),
    "nvmlDeviceGetPowerUsage": ("powerUsage",),
}  # fmt: skip
TELEMETRY = (
    "memoryCopyUtilization", "encoderUtilization", "decoderUtilization", "memoryTemperature",
    "smClock", "memoryClock",
    "energy", "pcieTxThroughput", "pcieRxThroughput", "pcieReplays", "remappedRowsCorrectable",
    "remappedRowsUncorrectable", "rowRemapFailed", "nvlinkLinks", "nvlinkTx", "nvlinkRx",
)  # fmt: skip
"""Read after the four calls above: a card lost in any of them reports none of these."""


@pytest.mark.parametrize("error", ERRORS)
@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
                                  *SAMPLE_CALLS])  # fmt: skip
def test_sample_failure_matrix(tmp_path: Path, call: str, error: str) -> None:
    expected = _samples(rig(tmp_path / "baseline"))
    r = rig(tmp_path / "faulty", faults={3: {call: error}})
    got = _samples(r)
    if call in _IDENTITY:
        del expected[3]
    else:
        order = list(SAMPLE_CALLS)
        dropped = order[order.index(call) :] if error == "GPU_IS_LOST" else [call]
        keys = [k for each in dropped for k in SAMPLE_CALLS[each]]
        for key in (*keys, *(TELEMETRY if error == "GPU_IS_LOST" else ())):
            expected[3].pop(key, None)
        expected[3]["unhealthy"] = error == "GPU_IS_LOST"
    assert got == expected
    assert r.sim.refcount == 0


def test_a_lost_card_known_from_an_earlier_pass_stays_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(tmp_path)
    r.backend.detect()
    r.sim.lost.add(3)  # falls off the bus between passes: even its handle is lost now
    with caplog.at_level(logging.WARNING):
        (group,) = _wire(r.backend.detect())
    card = group["accelerators"][3]
    assert (card["id"], card["status"]["unhealthy"]) == (_UUID + "63", True)
    assert card["topology"]["pciBusId"] == "0000:5d:00.0"
    assert "card 3" in caplog.text and _UUID + "63" in caplog.text
    assert _samples(r)[3] == {"id": _UUID + "63", "unhealthy": True}
    # a fresh backend never saw it, so it can only leave it out
    fresh = rig(tmp_path / "fresh")
    fresh.sim.lost.add(3)
    assert len(_wire(fresh.backend.detect())[0]["accelerators"]) == 7


# -- grouping -----------------------------------------------------------------------------------


def _card(index: int, name: str | None, memory_mib: int | None) -> nvidia_facts.CardFacts:
    return nvidia_facts.CardFacts(
        index=index,
        uuid=f"GPU-{index}",
        name=name,
        memory_bytes=memory_mib << 20 if memory_mib is not None else None,
        cuda_cores=6912,
        capability=(8, 0),
    )


def test_same_product_with_different_memory_gets_memory_suffixed_ids() -> None:
    groups = nvidia_facts.build_groups(
        [_card(0, "NVIDIA A100-SXM4-40GB", 40960), _card(1, "NVIDIA A100-SXM4-40GB", 81920),
         _card(2, "NVIDIA A100-SXM4-40GB", None), _card(3, "NVIDIA A10", 23028)],
        driver_version=None, cuda_driver_version=None, simulated=False,
    )  # fmt: skip
    assert [(g.id, g.memory, [a.index for a in g.accelerators]) for g in groups] == [
        ("nvidia-a100-sxm4-40gb-40g", 40960, [0]),
        ("nvidia-a100-sxm4-40gb-80g", 81920, [1]),
        ("nvidia-a100-sxm4-40gb", None, [2]),  # unknown memory matches neither
        ("nvidia-a10", 23028, [3]),
    ]
    assert all(g.simulated is False and g.family == "Ampere" and g.cores == 108 for g in groups)


def test_a_card_with_unknown_memory_joins_its_only_product_group() -> None:
    groups = nvidia_facts.build_groups(
        [_card(0, "NVIDIA A100-SXM4-40GB", 40960), _card(1, "NVIDIA A100-SXM4-40GB", None),
         _card(2, None, 40960)],
        driver_version="570.1", cuda_driver_version=12080, simulated=True,
    )  # fmt: skip
    assert [(g.id, g.name, [a.index for a in g.accelerators]) for g in groups] == [
        ("nvidia-a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", [0, 1]),
        ("nvidia-gpu", "NVIDIA GPU", [2]),
    ]
    assert groups[1].runtime_version == "12.8" and groups[1].simulated is True


def test_any_other_nvml_error_on_an_optional_call_costs_only_the_field(tmp_path: Path) -> None:
    r = rig(tmp_path, faults={3: {"nvmlDeviceGetMinorNumber": "DRIVER_NOT_LOADED"}})
    (group,) = _wire(r.backend.detect())
    assert "physicalIndexes" not in group["accelerators"][3]
    assert group["accelerators"][4]["physicalIndexes"] == [4]

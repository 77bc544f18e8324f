from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from agent.devices.libs import nvml
from agent.devices.libs.nvml import (
    Nvml,
    NvmlCallFailed,
    NvmlGpuLost,
    NvmlUnavailable,
    NvmlUnsupported,
)
from agent.devices.simulation import profiles
from agent.devices.simulation.fakenvml import NVMLError, SimulatedNvml


def _sim(name: str = "nvidia-h200x8", **card_changes: object) -> SimulatedNvml:
    host = profiles.load(name).nvidia
    assert host is not None
    cards = tuple(msgspec.structs.replace(c, **card_changes) for c in host.cards)
    return SimulatedNvml(msgspec.structs.replace(host, cards=cards))


class _Library:
    """A minimal pynvml stand-in whose functions are set per test."""

    NVMLError = NVMLError
    nvmlMemory_v2 = 0x02000028

    def __init__(self, **functions: Any) -> None:
        self.__dict__.update(functions)


def _raise(code: int) -> Any:
    def fail(*_args: object, **_kwargs: object) -> None:
        raise NVMLError(code)

    return fail


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (3, NvmlUnsupported),  # NOT_SUPPORTED
        (4, NvmlUnsupported),  # NO_PERMISSION
        (13, NvmlUnsupported),  # FUNCTION_NOT_FOUND
        (15, NvmlGpuLost),
        (12, NvmlUnavailable),  # LIBRARY_NOT_FOUND
        (9, NvmlUnavailable),  # DRIVER_NOT_LOADED
        (1, NvmlCallFailed),  # UNINITIALIZED
        (999, NvmlCallFailed),  # UNKNOWN
        (10, NvmlCallFailed),  # TIMEOUT
    ],
)
def test_every_code_class_maps_to_its_error(code: int, error: type[Exception]) -> None:
    adapter = Nvml(_Library(nvmlDeviceGetName=_raise(code)))
    with pytest.raises(error) as info:
        adapter.name(object())
    assert isinstance(info.value.__cause__, NVMLError)
    assert info.value.call == "nvmlDeviceGetName"
    assert info.value.code == code
    # NOT_SUPPORTED says the card has no such value; it is raised but not counted as an error.
    expected = {} if code == 3 else {"nvmlDeviceGetName": 1}
    assert adapter.errors_by_call == expected


def test_call_failed_names_the_call_and_code() -> None:
    adapter = Nvml(_Library(nvmlDeviceGetUUID=_raise(999)))
    with pytest.raises(NvmlCallFailed, match=r"nvmlDeviceGetUUID: Unknown Error \(UNKNOWN\)"):
        adapter.uuid(object())


def test_a_symbol_the_binding_lacks_is_unsupported() -> None:
    adapter = Nvml(_Library())
    with pytest.raises(NvmlUnsupported) as info:
        adapter.num_cores(object())
    assert info.value.code_name == "FUNCTION_NOT_FOUND"
    assert adapter.errors_by_call["nvmlDeviceGetNumGpuCores"] == 1


def test_the_real_bindings_gpu_lost_maps_to_gpu_lost() -> None:
    pynvml = pytest.importorskip("pynvml")

    def lost(_h: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    adapter = Nvml(SimpleNamespace(NVMLError=pynvml.NVMLError, nvmlDeviceGetName=lost))
    with pytest.raises(NvmlGpuLost):
        adapter.name(object())


def test_a_failed_init_is_retried_on_the_next_pass() -> None:
    answers = [NVMLError(9), None]

    def init() -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    shutdowns: list[int] = []
    adapter = Nvml(_Library(nvmlInit=init, nvmlShutdown=lambda: shutdowns.append(1)))
    with pytest.raises(NvmlUnavailable), adapter.session():
        pass
    assert shutdowns == []  # nothing to pair with a failed init
    with adapter.session():
        pass
    assert shutdowns == [1]


def test_session_shuts_down_even_when_the_pass_raises() -> None:
    sim = _sim()
    adapter = Nvml(sim)
    with pytest.raises(RuntimeError), adapter.session():
        assert sim.refcount == 1
        raise RuntimeError("pass failed")
    assert sim.refcount == 0


def test_a_failed_shutdown_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    adapter = Nvml(_Library(nvmlInit=lambda: None, nvmlShutdown=_raise(999)))
    with caplog.at_level(logging.WARNING), adapter.session():
        pass
    assert "NVML shutdown failed" in caplog.text


def test_memory_prefers_v2_and_falls_back_to_v1() -> None:
    adapter = Nvml(_sim())
    adapter.init()
    h = adapter.handle(1)
    assert adapter.memory(h) == (143771 << 20, 71880 << 20)  # v2: reserved not counted

    adapter = Nvml(_sim(faults={"nvmlDeviceGetMemoryInfo_v2": "FUNCTION_NOT_FOUND"}))
    adapter.init()
    assert adapter.memory(adapter.handle(1)) == (143771 << 20, (71880 + 528) << 20)


def test_memory_does_not_fall_back_for_a_lost_card() -> None:
    sim = _sim(faults={"nvmlDeviceGetMemoryInfo_v2": "GPU_IS_LOST"})
    adapter = Nvml(sim)
    adapter.init()
    with pytest.raises(NvmlGpuLost):
        adapter.memory(adapter.handle(0))
    assert [c for c in sim.calls if c[0] == "nvmlDeviceGetMemoryInfo"] == [
        ("nvmlDeviceGetMemoryInfo", 0)
    ]


def test_bytes_and_str_are_both_decoded() -> None:
    pci_info = SimpleNamespace(busIdLegacy=b"", busId=b"00000000:1A:00.0\x00")
    adapter = Nvml(
        _Library(
            nvmlDeviceGetName=lambda _h: b"NVIDIA H200\x00",
            nvmlDeviceGetUUID=lambda _h: "GPU-1234 ",
            nvmlSystemGetDriverVersion=lambda: b"570.124.06",
            nvmlDeviceGetPciInfo=lambda _h: pci_info,
        )
    )
    assert adapter.name(None) == "NVIDIA H200"
    assert adapter.uuid(None) == "GPU-1234"
    assert adapter.driver_version() == "570.124.06"
    assert adapter.pci_bus_id(None) == "0000:1a:00.0"  # busId when busIdLegacy is empty


def test_bus_id_prefers_the_legacy_form() -> None:
    pci_info = SimpleNamespace(busIdLegacy="0000:DB:00.0", busId="00000001:DB:00.0")
    adapter = Nvml(_Library(nvmlDeviceGetPciInfo=lambda _h: pci_info))
    assert adapter.pci_bus_id(None) == "0000:db:00.0"


def test_gpu_instance_profiles_scan_skips_absent_indexes_and_reads_placements() -> None:
    adapter = Nvml(_sim("nvidia-h100x8-mig"))
    adapter.init()
    found = adapter.gpu_instance_profiles(adapter.handle(0))
    assert [p.index for p in found] == [0, 1, 2, 3, 4, 7, 9]
    assert found[-1] == nvml.GpuInstanceProfile(
        index=9,
        name="1g.20gb",
        memory_mib=20096,
        slice_count=1,
        instance_count=4,
        multiprocessor_count=26,
        placements=((0, 2), (2, 2), (4, 2), (6, 2)),
    )
    assert found[5].name == "1g.10gb+me"  # the "MIG " prefix is stripped
    assert adapter.errors_by_call == {}  # absent profile indexes are not errors


@pytest.mark.parametrize(("fault", "error"), [("NO_PERMISSION", NvmlUnsupported),
                                              ("UNKNOWN", NvmlCallFailed)])  # fmt: skip
def test_gpu_instance_profile_failures_other_than_absent_are_raised(
    fault: str, error: type[Exception]
) -> None:
    adapter = Nvml(_sim("nvidia-h100x8-mig",
                        faults={"nvmlDeviceGetGpuInstanceProfileInfo": fault}))  # fmt: skip
    adapter.init()
    with pytest.raises(error):
        adapter.gpu_instance_profiles(adapter.handle(0))


def test_affinities_are_lists_of_numbers() -> None:
    adapter = Nvml(_sim())
    adapter.init()
    h = adapter.handle(4)
    assert adapter.cpu_affinity(h) == [*range(48, 96), *range(144, 192)]
    assert adapter.memory_affinity(h) == [1]


def test_system_and_usage_values() -> None:
    adapter = Nvml(_sim())
    adapter.init()
    h = adapter.handle(2)
    assert adapter.cuda_driver_version() == 12080
    assert adapter.device_count() == 8
    assert (adapter.minor_number(h), adapter.compute_capability(h)) == (2, (9, 0))
    assert adapter.architecture(h) == 9
    assert adapter.mig_mode(h) is False  # the simulated H200 is not MIG-capable
    assert "nvmlDeviceGetMigMode" not in adapter.errors_by_call
    assert adapter.utilization(h) == 100
    assert adapter.temperature(h) == 64
    assert adapter.power_usage(h) == 689999


def test_mig_mode_is_the_current_mode() -> None:
    adapter = Nvml(_sim("nvidia-h100x8-mig"))
    adapter.init()
    assert adapter.mig_mode(adapter.handle(0)) is True
    assert adapter.mig_mode(adapter.handle(4)) is False


def test_mig_codes_map_to_their_errors() -> None:
    from agent.devices.libs.nvml import NvmlInUse, NvmlNoRoom, NvmlNotPermitted, map_error

    assert isinstance(map_error("x", 23, ""), NvmlNoRoom)
    assert isinstance(map_error("x", 19, ""), NvmlInUse)
    assert isinstance(map_error("x", 4, ""), NvmlNotPermitted)
    assert isinstance(map_error("x", 4, ""), NvmlUnsupported)  # detection still drops the field


def test_mig_instances_round_trip_through_the_adapter() -> None:
    from agent.devices.libs.nvml import NvmlInUse, NvmlNoRoom
    from agent.devices.simulation import profiles

    host = profiles.load("nvidia-h100x8-mig").nvidia
    adapter = Nvml(SimulatedNvml(host))
    with adapter.session():
        h = adapter.handle_by_uuid(host.cards[0].uuid) if host else None
        gi = adapter.create_gpu_instance(h, 1, 2, 2)  # 2g.20gb at slices 2-3
        ci = adapter.create_compute_instance(gi.handle, 2)
        (mig,) = adapter.mig_devices(h)
        assert (mig.gpu_instance_id, mig.compute_instance_id) == (gi.id, ci.id)
        assert adapter.gpu_instances(h, 1, 3) == (gi,)
        assert adapter.compute_instances(gi.handle) == (ci,)
        with pytest.raises(NvmlNoRoom):
            adapter.create_gpu_instance(h, 3, 0, 4)
        with pytest.raises(NvmlInUse):
            adapter.destroy_gpu_instance(gi.handle)
        adapter.destroy_compute_instance(ci.handle)
        adapter.destroy_gpu_instance(gi.handle)
        assert adapter.mig_devices(h) == ()


def test_a_card_without_mig_reads_as_mig_off_without_counting_an_error() -> None:
    adapter = Nvml(_Library(nvmlDeviceGetMigMode=_raise(3)))
    for _ in range(8):
        assert adapter.mig_mode(object()) is False
    assert adapter.errors_by_call == {}

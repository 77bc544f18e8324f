from __future__ import annotations

import ctypes

import msgspec
import pytest

from agent.devices.simulation import profiles
from agent.devices.simulation.fakenvml import NVMLError, SimulatedHandle, SimulatedNvml
from agent.errors import ProfileError


def _host(name: str = "nvidia-h200x8", **card_changes: object) -> profiles.NvidiaHost:
    host = profiles.load(name).nvidia
    assert host is not None
    cards = tuple(msgspec.structs.replace(c, **card_changes) for c in host.cards)
    return msgspec.structs.replace(host, cards=cards)


def _started(host: profiles.NvidiaHost | None = None) -> SimulatedNvml:
    sim = SimulatedNvml(host or _host())
    sim.nvmlInit()
    return sim


def _code(call: object, *args: object) -> int:
    with pytest.raises(NVMLError) as info:
        call(*args)  # type: ignore[operator]
    return info.value.value


def test_calls_before_init_are_uninitialized() -> None:
    sim = SimulatedNvml(_host())
    assert _code(sim.nvmlDeviceGetCount) == 1
    assert _code(sim.nvmlDeviceGetHandleByIndex, 0) == 1


def test_init_is_reference_counted() -> None:
    sim = SimulatedNvml(_host())
    sim.nvmlInit()
    sim.nvmlInit()
    sim.nvmlShutdown()
    assert sim.nvmlDeviceGetCount() == 8
    sim.nvmlShutdown()
    assert _code(sim.nvmlDeviceGetCount) == 1


def test_no_driver_is_library_not_found_and_init_error_is_raised() -> None:
    assert _code(SimulatedNvml(None).nvmlInit) == 12
    host = msgspec.structs.replace(_host(), init_error="DRIVER_NOT_LOADED")
    sim = SimulatedNvml(host)
    assert _code(sim.nvmlInit) == 9
    assert str(NVMLError(9)) == "Driver Not Loaded"


def test_unknown_fault_names_are_profile_errors() -> None:
    with pytest.raises(ProfileError, match="card 0"):
        SimulatedNvml(_host(faults={"nvmlDeviceGetName": "ON_FIRE"}))
    with pytest.raises(ProfileError, match="system"):
        SimulatedNvml(_host(), system_faults={"nvmlDeviceGetCount": "ON_FIRE"})


def test_a_fault_fails_only_its_call_and_card() -> None:
    host = _host()
    cards = list(host.cards)
    cards[3] = msgspec.structs.replace(cards[3], faults={"nvmlDeviceGetName": "NO_PERMISSION"})
    sim = _started(msgspec.structs.replace(host, cards=tuple(cards)))
    assert _code(sim.nvmlDeviceGetName, SimulatedHandle(3)) == 4
    assert sim.nvmlDeviceGetUUID(SimulatedHandle(3)).startswith("GPU-")
    assert sim.nvmlDeviceGetName(SimulatedHandle(2)) == "NVIDIA H200"


def test_a_lost_card_answers_nothing_afterwards() -> None:
    host = _host()
    cards = list(host.cards)
    cards[1] = msgspec.structs.replace(cards[1], faults={"nvmlDeviceGetName": "GPU_IS_LOST"})
    sim = _started(msgspec.structs.replace(host, cards=tuple(cards)))
    assert sim.nvmlDeviceGetUUID(SimulatedHandle(1))  # before the loss it answers
    assert _code(sim.nvmlDeviceGetName, SimulatedHandle(1)) == 15
    assert _code(sim.nvmlDeviceGetUUID, SimulatedHandle(1)) == 15
    assert _code(sim.nvmlDeviceGetHandleByIndex, 1) == 15
    assert sim.nvmlDeviceGetUUID(SimulatedHandle(2))
    assert sim.lost == {1}


def test_memory_v1_counts_reserved_as_used_and_v2_fault_spares_v1() -> None:
    sim = _started(_host(faults={"nvmlDeviceGetMemoryInfo_v2": "FUNCTION_NOT_FOUND"}))
    h = SimulatedHandle(1)  # 71880 MiB used, 528 reserved
    v1 = sim.nvmlDeviceGetMemoryInfo(h)
    assert (v1.total, v1.used) == (143771 << 20, (71880 + 528) << 20)
    assert v1.free == (143771 - 71880 - 528) << 20
    assert _code(lambda: sim.nvmlDeviceGetMemoryInfo(h, version=sim.nvmlMemory_v2)) == 13

    v2 = _started().nvmlDeviceGetMemoryInfo(h, version=0x02000028)
    assert (v2.used, v2.reserved) == (71880 << 20, 528 << 20)


def test_pci_info_has_legacy_and_eight_digit_domain_forms() -> None:
    info = _started().nvmlDeviceGetPciInfo(SimulatedHandle(7))
    assert info.busIdLegacy == b"0000:DB:00.0"
    assert info.busId == b"00000000:DB:00.0"


def test_placements_follow_the_count_then_fill_protocol() -> None:
    sim = _started(_host("nvidia-h100x8-mig"))
    h, count = SimulatedHandle(0), ctypes.c_uint(0)
    sim.nvmlDeviceGetGpuInstancePossiblePlacements(h, 9, None, ctypes.pointer(count))
    assert count.value == 4
    array = (sim.c_nvmlGpuInstancePlacement_t * 4)()
    sim.nvmlDeviceGetGpuInstancePossiblePlacements(h, 9, array, ctypes.pointer(count))
    assert [(p.start, p.size) for p in array] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    short = (sim.c_nvmlGpuInstancePlacement_t * 1)()
    count.value = 1
    assert _code(sim.nvmlDeviceGetGpuInstancePossiblePlacements, h, 9, short,
                 ctypes.pointer(count)) == 7  # fmt: skip


def test_profile_info_is_unsupported_with_mig_off_or_for_an_absent_profile() -> None:
    sim = _started(_host("nvidia-h100x8-mig"))
    info = sim.nvmlDeviceGetGpuInstanceProfileInfo(SimulatedHandle(0), 4)
    assert (info.name, info.memorySizeMB, info.sliceCount) == (b"MIG 7g.80gb", 81152, 7)
    assert _code(sim.nvmlDeviceGetGpuInstanceProfileInfo, SimulatedHandle(0), 5) == 3
    assert _code(sim.nvmlDeviceGetGpuInstanceProfileInfo, SimulatedHandle(4), 4) == 3
    assert sim.nvmlDeviceGetMigMode(SimulatedHandle(4)) == [0, 0]
    assert _code(_started().nvmlDeviceGetMigMode, SimulatedHandle(0)) == 3  # H200 here: no MIG


def test_utilization_is_unsupported_on_a_mig_enabled_card() -> None:
    sim = _started(_host("nvidia-h100x8-mig"))
    assert _code(sim.nvmlDeviceGetUtilizationRates, SimulatedHandle(0)) == 3
    assert sim.nvmlDeviceGetUtilizationRates(SimulatedHandle(4)).gpu == 55


def test_affinity_masks_are_64_bit_words() -> None:
    sim = _started()
    words = sim.nvmlDeviceGetCpuAffinity(SimulatedHandle(4), 4)  # 48-95,144-191
    assert words == [0xFFFF << 48, 0xFFFFFFFF, ((1 << 48) - 1) << 16, 0]
    assert sim.nvmlDeviceGetMemoryAffinity(SimulatedHandle(4), 2, 0) == [0b10, 0]


def test_the_call_log_names_function_and_card() -> None:
    sim = _started()
    sim.nvmlDeviceGetCount()
    sim.nvmlDeviceGetName(sim.nvmlDeviceGetHandleByIndex(2))
    assert sim.calls == [
        ("nvmlInit", None),
        ("nvmlDeviceGetCount", None),
        ("nvmlDeviceGetHandleByIndex", 2),
        ("nvmlDeviceGetName", 2),
    ]


def test_xids_from_the_profile_and_injected_are_consumed_once() -> None:
    sim = SimulatedNvml(_host(xids=(79,)))
    sim.inject_xid(2, 48)
    assert sim.pending_xids(2) == [79, 48]
    assert sim.pending_xids(2) == []
    assert sim.pending_xids(0) == [79]


@pytest.mark.parametrize("code", [1, 3, 4, 9, 12, 13, 15, 999])
def test_error_messages_match_the_real_binding(code: int) -> None:
    pynvml = pytest.importorskip("pynvml")
    assert str(NVMLError(code)) == str(pynvml.NVMLError(code))
    assert NVMLError(code).value == pynvml.NVMLError(code).value


def test_constants_and_signatures_match_the_real_binding() -> None:
    import inspect

    pynvml = pytest.importorskip("pynvml")
    for constant in ("nvmlMemory_v2", "NVML_TEMPERATURE_GPU", "NVML_AFFINITY_SCOPE_NODE",
                     "NVML_GPU_INSTANCE_PROFILE_COUNT"):  # fmt: skip
        assert getattr(SimulatedNvml, constant) == getattr(pynvml, constant), constant
    for name, method in inspect.getmembers(SimulatedNvml, inspect.isfunction):
        if name.startswith("nvml"):
            real = list(inspect.signature(getattr(pynvml, name)).parameters)
            assert list(inspect.signature(method).parameters)[1:] == real, name


# ------------------------------------------------------------------ MIG management


def _mig_started() -> SimulatedNvml:
    return _started(_host("nvidia-h100x8-mig"))


def _placement(start: int, size: int) -> object:
    return ctypes.pointer(SimulatedNvml.c_nvmlGpuInstancePlacement_t(start, size))


def test_mig_refuses_what_nvml_refuses() -> None:
    sim = _mig_started()
    card, off = SimulatedHandle(0), SimulatedHandle(4)
    create = sim.nvmlDeviceCreateGpuInstanceWithPlacement
    gi = create(card, 2, _placement(0, 4))  # 3g.40gb on slices 0-3
    assert _code(create, card, 0, _placement(2, 1)) == 23  # overlaps: INSUFFICIENT_RESOURCES
    assert _code(create, card, 4, _placement(0, 8)) == 23  # 7g.80gb: the card is not empty
    assert _code(create, card, 0, _placement(7, 1)) == 2  # not a legal start: INVALID_ARGUMENT
    assert _code(create, off, 0, _placement(0, 1)) == 3  # MIG off: NOT_SUPPORTED
    ci = sim.nvmlGpuInstanceCreateComputeInstance(gi, 2)
    assert _code(sim.nvmlGpuInstanceCreateComputeInstance, gi, 0) == 23  # GI full
    assert _code(sim.nvmlGpuInstanceDestroy, gi) == 19  # CIs inside: IN_USE
    sim.nvmlComputeInstanceDestroy(ci)
    sim.nvmlGpuInstanceDestroy(gi)
    assert _code(sim.nvmlGpuInstanceGetInfo, gi) == 2  # a destroyed handle
    assert sim.instances(0) == []


def test_mig_devices_have_uuids_and_slots() -> None:
    sim = _mig_started()
    card = SimulatedHandle(0)
    gi = sim.nvmlDeviceCreateGpuInstanceWithPlacement(card, 0, _placement(5, 1))
    sim.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(card, 0)
    uuid = sim.nvmlDeviceGetUUID(mig)
    assert uuid.startswith("MIG-") and uuid != sim.nvmlDeviceGetUUID(card)
    assert sim.nvmlDeviceGetGpuInstanceId(mig) == sim.nvmlGpuInstanceGetInfo(gi).id
    assert _code(sim.nvmlDeviceGetMigDeviceHandleByIndex, card, 1) == 6  # empty slot
    assert sim.instances(0) == [("1g.10gb", 5, 1, (uuid,))]
    sim.make_busy(uuid, 1)
    (ci,) = [h for h, t in sim._handles.items() if t[2] is not None]
    assert _code(sim.nvmlComputeInstanceDestroy, ci) == 19
    sim.nvmlComputeInstanceDestroy(ci)

"""The simulators read through bindings we did not write, and our readers agree with them.

Each packaged profile's simulated library is handed to an independent binding (its function
lookup pointed at the simulator) and to our reader. The binding calls the simulator with its own
structures and argument conventions, so a simulator that only understands our adapter's calls,
or answers in other units than the real library, fails here; and what our reader reports (ids,
MiB, W, °C) must be what the binding reads, converted as the oracle's detector converts it.

Oracles: gpustack-runtime 0.2.6 (``pydcmi``, ``pycndev``, ``pyrocmsmi``, ``pymxsml``, ``pyixml``,
``pyhgml``, and its detectors' conversions) and mthreads-ml-py 2.4.3 (``pymtml``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pymtml
import pytest
from gpustack_runtime.detector import pycndev, pydcmi, pyhgml, pyixml, pymxsml, pyrocmsmi
from vendor_helpers import load, simulator

from agent.devices import ascend, cambricon, hygon, iluvatar, metax, mthreads, thead
from agent.devices.hostfs import HostFS
from agent.devices.libs import clib
from agent.devices.vendor import Usage

HOST = HostFS(Path("/nonexistent"))


def _get(function: Callable[..., Any], *args: Any) -> Any:
    """As the readers' ``get``: a value the library does not offer is left out (None)."""
    try:
        return function(*args)
    except clib.LibUnsupported:
        return None


def _through(
    monkeypatch: pytest.MonkeyPatch, oracle: ModuleType, lookup: str, library: Any
) -> None:
    """Point the oracle's C-function lookup at the simulated library."""
    monkeypatch.setattr(oracle, lookup, lambda name: getattr(library, name))


def _close(ours: int | None, theirs: float) -> bool:
    """Same unit, ours whole where the oracle keeps a fraction (Ascend's 0.1 W)."""
    return ours is not None and abs(ours - theirs) < 1


def test_hygon_through_pyrocmsmi(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = load("hygon-k100-ai-x8")
    library = simulator("hygon", profile)
    reader = hygon.HygonReader(hygon.rocmsmi.RocmSmi(library), HOST, None)
    _through(monkeypatch, pyrocmsmi, "_rocmsmiGetFunctionPointer", library)
    monkeypatch.setattr(pyrocmsmi, "_rocmsmiCheckReturn", _raise_on(pyrocmsmi.ROCMSMIError))
    monkeypatch.setattr(pyrocmsmi, "rsmi_power_type_t", ctypes.c_int, raising=False)
    with reader.session():
        assert pyrocmsmi.rsmi_num_monitor_devices() == len(reader.slots())
        for index in reader.slots():
            handle, ours = reader.identify(index)
            assert ours == f"GPU-{pyrocmsmi.rsmi_dev_unique_id_get(index)[2:]}"  # GR hygon.py
            assert reader.smi.pci_bus_id(index) == pyrocmsmi.rsmi_dev_pci_id_get(index)
            usage: Usage = reader.measure(handle, _get)
            assert usage.memory_mib == pyrocmsmi.rsmi_dev_memory_total_get(index, 0) >> 20
            assert usage.memory_used_mib == pyrocmsmi.rsmi_dev_memory_usage_get(index, 0) >> 20
            try:  # W; GR reads rsmi_dev_power_get, and we fall back to the average without it
                power = pyrocmsmi.rsmi_dev_power_get(index)
            except pyrocmsmi.ROCMSMIError:
                power = pyrocmsmi.rsmi_dev_power_ave_get(index)
            assert usage.power_w == power
            assert usage.temperature == pyrocmsmi.rsmi_dev_temp_metric_get(index, 0, 0)  # //1000
            assert usage.cores_utilization == pyrocmsmi.rsmi_dev_busy_percent_get(index)


def _raise_on(error: type[Exception]) -> Callable[[int], int]:
    def check(status: int) -> int:
        if status != 0:
            raise error(status)
        return status

    return check


def test_cambricon_through_pycndev(monkeypatch: pytest.MonkeyPatch) -> None:
    library = simulator("cambricon", load("cambricon-mlu370-x8-x4"))
    reader = cambricon.reader(library, HOST)
    _through(monkeypatch, pycndev, "_cndevGetFunctionPointer", library)
    with reader.session():
        assert pycndev.cndevGetDeviceCount() == len(reader.slots())
        for index in reader.slots():
            (slot, h), ours = reader.identify(index)
            theirs = pycndev.cndevGetDeviceHandleByIndex(index)
            assert h == theirs and ours == pycndev.cndevGetUUID(theirs)  # "MLU-" + UUID
            usage = reader.measure((slot, h), _get)
            memory = pycndev.cndevGetMemoryUsageV2(theirs)  # GR: MiB as is
            assert (usage.memory_mib, usage.memory_used_mib) == (
                memory.physicalMemoryTotal,
                memory.physicalMemoryUsed,
            )
            assert usage.power_w == pycndev.cndevGetDevicePowerInfo(theirs).usage  # W
            assert usage.temperature == pycndev.cndevGetTemperatureInfo(theirs).chip
            utilization = pycndev.cndevGetDeviceUtilizationInfo(theirs)
            assert usage.cores_utilization == utilization.averageCoreUtilization
            pcie = pycndev.cndevGetPCIeInfoV2(theirs)
            assert reader.cndev.pci_bus_id(h) == (
                f"{pcie.domain:04x}:{pcie.bus:02x}:{pcie.device:02x}.{pcie.function:x}"
            )


@pytest.mark.parametrize("api", [1, 2])
def test_ascend_through_pydcmi(monkeypatch: pytest.MonkeyPatch, api: int) -> None:
    profile = load("ascend-910b2x8")
    if api == 2:  # the same chips behind a V2-only driver
        assert profile.ascend is not None
        profile = profile.__class__(**{**_fields(profile), "ascend": _v2(profile.ascend)})
    library = simulator("ascend", profile)
    reader = ascend.reader(library, HOST)
    _through(monkeypatch, pydcmi, "_dcmiGetFunctionPointer", library)
    with reader.session():
        assert reader.dcmi.v2 == (api == 2)
        for slot in reader.slots():
            _, ours = reader.identify(slot)
            usage = reader.measure(slot, _get)
            if api == 1:
                card, device = slot
                words = pydcmi.dcmi_get_device_die_v2(card, device, pydcmi.DCMI_DIE_TYPE_VDIE)
                hbm = pydcmi.dcmi_get_device_hbm_info(card, device)
                power = pydcmi.dcmi_get_device_power_info(card, device)
                temperature = pydcmi.dcmi_get_device_temperature(card, device)
                logic = pydcmi.dcmi_get_device_logic_id(card, device)
                physical = pydcmi.dcmi_get_device_phyid_from_logicid(logic)
            else:
                dev = slot[0]
                words = pydcmi.dcmiv2_get_device_die_id(dev, pydcmi.DCMI_DIE_TYPE_VDIE)
                hbm = pydcmi.dcmiv2_get_device_hbm_info(dev)
                power = pydcmi.dcmiv2_get_device_power_info(dev)
                temperature = pydcmi.dcmiv2_get_device_temperature(dev)
                physical = pydcmi.dcmiv2_get_chip_phy_id_by_dev_id(dev)
            assert [int(w, 16) for w in ours[4:].split("-")] == [int(w, 16) for w in words.split()]
            assert (usage.memory_mib, usage.memory_used_mib) == (hbm.memory_size, hbm.memory_usage)
            assert _close(usage.power_w, power / 10)  # GR ascend.py: 0.1 W to W
            assert usage.temperature == temperature
            assert reader.dcmi.physical_id(reader.dcmi.logic_id(*slot)) == physical


def _fields(struct: Any) -> dict[str, Any]:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}


def _v2(host: Any) -> Any:
    return host.__class__(**{**_fields(host), "api": 2})


def test_metax_through_pymxsml(monkeypatch: pytest.MonkeyPatch) -> None:
    library = simulator("metax", load("metax-c500-x8"))
    reader = metax.reader(library, HOST)
    _through(monkeypatch, pymxsml, "_mxsmlGetFunctionPointer", library)
    with reader.session():
        for index in reader.slots():
            handle, ours = reader.identify(index)
            info = pymxsml.mxSmlGetDeviceInfo(index)
            assert ours == info.uuid
            usage = reader.measure(handle, _get)
            memory = pymxsml.mxSmlGetMemoryInfo(index)
            assert usage.memory_mib == memory.vramTotal >> 10  # GR metax.py: KB to MiB
            assert usage.memory_used_mib == memory.vramUse >> 10
            hotspot = pymxsml.mxSmlGetTemperatureInfo(index, 0)
            assert usage.temperature == hotspot // 100  # GR metax.py: ×100 to °C
            ways = pymxsml.mxSmlGetBoardPowerInfo(index)
            assert usage.power_w == sum(w.power for w in ways) // 1000  # mW summed, to W


def test_mthreads_through_pymtml(monkeypatch: pytest.MonkeyPatch) -> None:
    library = simulator("mthreads", load("mthreads-s4000-x8"))
    reader = mthreads.reader(library, HOST)
    _through(monkeypatch, pymtml, "_mtmlGetFunctionPointer", library)
    with reader.session():
        handle = pymtml.c_mtmlLibrary_t()
        assert library.mtmlLibraryInit(ctypes.byref(handle)) == 0
        monkeypatch.setattr(pymtml, "libHandle", handle)
        assert pymtml.mtmlLibraryCountDevice() == len(reader.slots())
        for index in reader.slots():
            device, ours = reader.identify(index)
            theirs = device  # one open device, read by both (the library hands out one handle)
            try:
                assert ours == pymtml.mtmlDeviceGetUUID(theirs)
                assert reader.mtml.name(device) == pymtml.mtmlDeviceGetName(theirs)
                assert reader.mtml.pci_bus_id(device) == pymtml.mtmlDeviceGetPciInfo(theirs).sbdf
                usage = reader.measure(device, _get)
                memory = pymtml.mtmlDeviceInitMemory(theirs)
                assert usage.memory_mib == pymtml.mtmlMemoryGetTotal(memory) >> 20
                pymtml.mtmlDeviceFreeMemory(memory)
                assert usage.power_w == pymtml.mtmlDeviceGetPowerUsage(theirs) // 1000  # mW
            finally:
                reader.release(device)


@pytest.mark.parametrize(
    ("key", "profile", "oracle", "lookup", "prefix"),
    [("iluvatar", "iluvatar-bi-v150s-x2", pyixml, "_nvmlGetFunctionPointer", "nvml"),
     ("thead", "thead-ppu-zw810e-x16", pyhgml, "_hgmlGetFunctionPointer", "hgml")],
)  # fmt: skip
def test_the_nvml_clones_through_pyixml_and_pyhgml(
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    profile: str,
    oracle: ModuleType,
    lookup: str,
    prefix: str,
) -> None:
    library = simulator(key, load(profile))
    reader = (iluvatar if key == "iluvatar" else thead).reader(library, HOST)
    _through(monkeypatch, oracle, lookup, library)

    error = oracle.NVMLError if key == "iluvatar" else oracle.HGMLError

    def theirs(call: str, *args: Any) -> Any:
        """The oracle's reading, None where it reports NOT_SUPPORTED (as ours leaves it out)."""
        try:
            return getattr(oracle, prefix + call)(*args)
        except error as e:
            if "Not Supported" not in str(e):
                raise
            return None

    with reader.session():
        for index in reader.slots():
            handle, ours = reader.identify(index)
            device = getattr(oracle, prefix + "DeviceGetHandleByIndex")(index)
            assert ours == theirs("DeviceGetUUID", device)
            usage = reader.measure(handle, _get)
            memory = theirs("DeviceGetMemoryInfo", device)
            assert (usage.memory_mib, usage.memory_used_mib) == (
                memory.total >> 20,  # GR iluvatar.py / thead.py: bytes to MiB
                memory.used >> 20,
            )
            power = theirs("DeviceGetPowerUsage", device)
            assert usage.power_w == (power // 1000 if power is not None else None)  # mW to W
            assert usage.temperature == theirs("DeviceGetTemperature", device, 0)
            assert usage.cores_utilization == theirs("DeviceGetUtilizationRates", device).gpu

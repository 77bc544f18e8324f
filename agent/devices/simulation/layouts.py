"""How many bytes each vendor library writes into each output structure, and who says so.

The simulators write this many bytes (:func:`agent.devices.simulation.fakelib.written`), not
``sizeof`` of the adapter's structure, so an adapter whose structure is shorter than the real one
is caught by the ordinary test run instead of overrunning the heap on a customer's node. The
numbers come from the vendors' headers and independent bindings, never from our adapters; the
conformance tests (``tests/agent/devices/libs/test_conformance.py``) check each one against its oracle
where an installed binding has the structure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Documented:
    size: int
    source: str


SIZES: dict[str, Documented] = {
    # Cambricon CNDev: cndev.h (CNDEV_VERSION_6), as bound by gpustack-runtime 0.2.6 pycndev.
    "cndevCardInfo_t": Documented(8, "cndev.h; pycndev c_cndevCardInfo_t"),
    "cndevUUID_t": Documented(56, "cndev.h; pycndev c_cndevUUID_t"),
    "cndevCardName_t": Documented(8, "cndev.h; pycndev c_cndevCardName_t"),
    "cndevMemoryInfoV2_t": Documented(176, "cndev.h (reserved[16] u64); pycndev"),
    "cndevPCIeInfoV2_t": Documented(64, "cndev.h (reserved[8] u32); pycndev"),
    "cndevVersionInfo_t": Documented(28, "cndev.h; pycndev c_cndevVersionInfo_t"),
    "cndevUtilizationInfo_t": Documented(328, "cndev.h; pycndev c_cndevUtilizationInfo_t"),
    "cndevTemperatureInfo_t": Documented(148, "cndev.h; pycndev c_cndevTemperatureInfo_t"),
    "cndevDevicePowerInfo_t": Documented(84, "cndev.h; pycndev c_cndevDevicePowerInfo_t"),
    # Huawei DCMI: dcmi_interface_api.h / _v2.h, as bound by gpustack-runtime 0.2.6 pydcmi.
    "dcmi_chip_info": Documented(100, "dcmi_interface_api.h; pydcmi c_dcmi_chip_info"),
    "dcmi_chip_info_v2": Documented(132, "dcmi_interface_api.h; pydcmi c_dcmi_chip_info_v2"),
    "dcmi_die_id": Documented(20, "dcmi_interface_api.h; pydcmi c_dcmi_die_id"),
    "dcmi_pcie_info_all": Documented(64, "dcmi_interface_api.h; pydcmi c_dcmi_pcie_info_all"),
    "dcmi_hbm_info": Documented(32, "dcmi_interface_api.h; pydcmi c_dcmi_hbm_info"),
    "dcmi_get_memory_info_stru": Documented(112, "dcmi_interface_api.h; pydcmi"),
    # Moore Threads MTML: mtml.h, as bound by mthreads-ml-py 2.4.3 pymtml.
    "MtmlPciInfo": Documented(104, "mtml.h (rsvd[6] int); pymtml c_mtmlPciInfo_t"),
    # MetaX MXSML: MxSml.h 2.3.1, as bound by gpustack-runtime 0.2.6 pymxsml.
    "mxSmlDeviceInfo_t": Documented(184, "MxSml.h; pymxsml c_mxsmlDeviceInfo_t"),
    "mxSmlMemoryInfo_t": Documented(48, "MxSml.h; pymxsml c_mxsmlMemoryInfo_t"),
    "mxSmlBoardWayElectricInfo_t": Documented(12, "MxSml.h; pymxsml"),
    # Hygon DMI MIG: dmi_mig.h 1.3.1, as bound by gpustack-runtime 0.2.6 pydmi.
    "dmiGpuInstanceProfileInfo_t": Documented(280, "dmi_mig.h 1.3.1; pydmi"),
    # NVML and its clones (IXML, HGML): nvml.h, as bound by nvidia-ml-py, pyixml and pyhgml.
    "nvmlPciInfo_t": Documented(68, "nvml.h (v3); pynvml nvmlPciInfo_t"),
    "nvmlMemory_t": Documented(24, "nvml.h; pynvml c_nvmlMemory_t"),
    "nvmlUtilization_t": Documented(8, "nvml.h; pynvml c_nvmlUtilization_t"),
    "nvmlGpuInstanceProfileInfo_t": Documented(48, "nvml.h; pynvml"),
    "nvmlGpuInstancePlacement_t": Documented(8, "nvml.h; pynvml"),
}

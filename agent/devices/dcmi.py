"""The DCMI adapter: the one module that calls Huawei's ``libdcmi.so`` (Ascend NPUs).

A ctypes binding of only the V1 calls the agent makes. DCMI addresses a chip by
``(card_id, device_id)``: a card may hold several chips (310P duo cards) and, on A3 boards, an
MCU unit that must be skipped (:meth:`Dcmi.unit_type`). Units as DCMI reports them: memory in MB
(MiB in practice), power in **0.1 W**, temperature in °C, utilization in percent.

Traps kept in mind: ``dcmi_get_device_logic_id`` takes its output pointer *first*; the v1 PCIe
call lacks the PCI domain, so only the v2 one is used; DDR products (310P) answer the HBM call
with a size of 0, so memory falls back to ``memory_info_v3``.

One call writes: ``dcmi_set_device_share_enable``, the chip's container-share flag, which the
driver must have on before a second container may open the chip. DCMI allows it only as root on
the physical machine (``OPER_NOT_PERMITTED`` otherwise, e.g. from an unprivileged container).
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.devices import clib

CANDIDATES = (
    "libdcmi.so",
    "/usr/local/Ascend/driver/lib64/driver/libdcmi.so",
    "/usr/local/dcmi/libdcmi.so",
)

# Status codes (dcmi_interface_api.h).
NOT_SUPPORT = -8255
NOT_SUPPORT_IN_CONTAINER = -8013
DEVICE_NOT_EXIST = -8008
UNINITIALIZED = -99997
CODES = clib.Codes(
    names={
        -8001: "INVALID_PARAMETER",
        -8002: "OPER_NOT_PERMITTED",
        -8003: "MEM_OPERATE_FAIL",
        -8005: "INNER_ERR",
        -8006: "TIME_OUT",
        -8007: "INVALID_DEVICE_ID",
        DEVICE_NOT_EXIST: "DEVICE_NOT_EXIST",
        -8009: "IOCTL_FAIL",
        -8012: "NOT_READY",
        NOT_SUPPORT_IN_CONTAINER: "NOT_SUPPORT_IN_CONTAINER",
        -8017: "IS_UPGRADING",
        -8020: "RESOURCE_OCCUPIED",
        -8023: "CONFIG_INFO_NOT_EXIST",
        NOT_SUPPORT: "NOT_SUPPORT",
        UNINITIALIZED: "UNINITIALIZED",
    },
    unsupported=frozenset({NOT_SUPPORT, NOT_SUPPORT_IN_CONTAINER, -8002}),
    lost=frozenset({DEVICE_NOT_EXIST}),
)

UNIT_NPU = 0
"""``DCMI_UNIT_TYPE_NPU``; MCU is 1, CPU 2."""
UTILIZATION_AICORE = 2
DIE_TYPE_VDIE = 1
MAX_CARDS = 64


class ChipInfo(ctypes.Structure):
    _fields_ = [
        ("chip_type", ctypes.c_char * 32),
        ("chip_name", ctypes.c_char * 32),
        ("chip_ver", ctypes.c_char * 32),
        ("aicore_cnt", ctypes.c_uint),
    ]


class DieId(ctypes.Structure):
    _fields_ = [("soc_die", ctypes.c_uint * 5)]


class PcieInfoAll(ctypes.Structure):
    _fields_ = [
        ("venderid", ctypes.c_uint),
        ("subvenderid", ctypes.c_uint),
        ("deviceid", ctypes.c_uint),
        ("subdeviceid", ctypes.c_uint),
        ("domain", ctypes.c_int),
        ("bdf_busid", ctypes.c_uint),
        ("bdf_deviceid", ctypes.c_uint),
        ("bdf_funcid", ctypes.c_uint),
        ("reserve", ctypes.c_char * 32),
    ]


class HbmInfo(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("memory_usage", ctypes.c_ulonglong),
        ("temp", ctypes.c_int),
        ("bandwith_util_rate", ctypes.c_uint),
    ]


class MemoryInfoV3(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),
        ("memory_available", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("hugepagesize", ctypes.c_ulong),
        ("hugepages_total", ctypes.c_ulong),
        ("hugepages_free", ctypes.c_ulong),
        ("utiliza", ctypes.c_uint),
        ("reserve", ctypes.c_char * 60),
    ]


def load() -> Any:
    """:raises clib.LibUnavailable: no candidate loads."""
    return clib.load("DCMI (libdcmi.so)", CANDIDATES, CODES)


class Dcmi(clib.Binding):
    """DCMI V1 calls returning plain values."""

    def __init__(self, library: Any) -> None:
        super().__init__(library, CODES)

    def init(self) -> None:
        self.call("dcmi_init")

    def driver_version(self) -> str:
        buf = ctypes.create_string_buffer(64)
        self.call("dcmi_get_driver_version", buf, 64)
        return clib.text(buf)

    def card_list(self) -> list[int]:
        count = ctypes.c_int(0)
        cards = (ctypes.c_int * MAX_CARDS)()
        self.call("dcmi_get_card_list", ctypes.byref(count), cards, MAX_CARDS)
        return list(cards[: min(count.value, MAX_CARDS)])

    def device_count(self, card: int) -> int:
        count = ctypes.c_int(0)
        self.call("dcmi_get_device_num_in_card", card, ctypes.byref(count))
        return count.value

    def unit_type(self, card: int, device: int) -> int:
        unit = ctypes.c_uint(0)
        self.call("dcmi_get_device_type", card, device, ctypes.byref(unit))
        return unit.value

    def logic_id(self, card: int, device: int) -> int:
        logic = ctypes.c_uint(0)
        self.call("dcmi_get_device_logic_id", ctypes.byref(logic), card, device)
        return logic.value

    def physical_id(self, logic_id: int) -> int:
        phy = ctypes.c_uint(0)
        self.call("dcmi_get_device_phyid_from_logicid", logic_id, ctypes.byref(phy))
        return phy.value

    def chip_info(self, card: int, device: int) -> tuple[str, int]:
        """``(chip name, AI cores)``: ``("910B2", 24)``."""
        info = ChipInfo()
        self.call("dcmi_get_device_chip_info", card, device, ctypes.byref(info))
        return clib.text(info.chip_name), int(info.aicore_cnt)

    def die_id(self, card: int, device: int) -> tuple[int, ...]:
        """The chip's virtual die id: five 32-bit words, the chip's only unique identity."""
        die = DieId()
        self.call("dcmi_get_device_die_v2", card, device, DIE_TYPE_VDIE, ctypes.byref(die))
        return tuple(int(w) for w in die.soc_die)

    def pci_bus_id(self, card: int, device: int) -> str:
        info = PcieInfoAll()
        self.call("dcmi_get_device_pcie_info_v2", card, device, ctypes.byref(info))
        return f"{info.domain:04x}:{info.bdf_busid:02x}:{info.bdf_deviceid:02x}.{info.bdf_funcid:x}"

    def memory(self, card: int, device: int) -> tuple[int, int]:
        """``(total, used)`` MiB: HBM when the chip has it, else the DDR figures of v3."""
        try:
            hbm = HbmInfo()
            self.call("dcmi_get_device_hbm_info", card, device, ctypes.byref(hbm))
            if hbm.memory_size > 0:
                return int(hbm.memory_size), int(hbm.memory_usage)
        except clib.LibUnsupported:
            pass
        info = MemoryInfoV3()
        self.call("dcmi_get_device_memory_info_v3", card, device, ctypes.byref(info))
        size = int(info.memory_size)
        return size, max(size - int(info.memory_available), 0)

    def aicore_utilization(self, card: int, device: int) -> int:
        rate = ctypes.c_uint(0)
        args = (card, device, UTILIZATION_AICORE, ctypes.byref(rate))
        self.call("dcmi_get_device_utilization_rate", *args)
        return rate.value

    def temperature(self, card: int, device: int) -> int:
        temp = ctypes.c_int(0)
        self.call("dcmi_get_device_temperature", card, device, ctypes.byref(temp))
        return temp.value

    def power_deciwatts(self, card: int, device: int) -> int:
        """Power drawn in 0.1 W (not W, not mW)."""
        power = ctypes.c_int(0)
        self.call("dcmi_get_device_power_info", card, device, ctypes.byref(power))
        return power.value

    def card_device_of(self, physical_id: int) -> tuple[int, int]:
        """``(card_id, device_id)`` of the chip with this physical id (outputs first, as in C)."""
        card, device = ctypes.c_int(0), ctypes.c_int(0)
        args = (ctypes.byref(card), ctypes.byref(device), physical_id)
        self.call("dcmi_get_card_id_device_id_from_phyid", *args)
        return card.value, device.value

    def share_enabled(self, card: int, device: int) -> bool:
        """Whether the chip's container-share flag is on (several containers may open it)."""
        flag = ctypes.c_int(0)
        self.call("dcmi_get_device_share_enable", card, device, ctypes.byref(flag))
        return flag.value == 1

    def set_share_enabled(self, card: int, device: int, enabled: bool) -> None:
        """Turn the container-share flag on or off; the driver keeps it until changed again."""
        self.call("dcmi_set_device_share_enable", card, device, 1 if enabled else 0)

"""The DCMI adapter: the one module that calls Huawei's ``libdcmi.so`` (Ascend NPUs).

A ctypes binding of only the V1 calls the agent makes. DCMI addresses a chip by
``(card_id, device_id)``: a card may hold several chips (310P duo cards) and, on A3 boards, an
MCU unit that must be skipped (:meth:`Dcmi.unit_type`). Units as DCMI reports them: memory in MB
(MiB in practice), power in **0.1 W**, temperature in °C, utilization in percent.

Traps kept in mind: ``dcmi_get_device_logic_id`` takes its output pointer *first*; the v1 PCIe
call lacks the PCI domain, so only the v2 one is used; DDR products (310P) answer the HBM call
with a size of 0, so memory falls back to ``memory_info_v3``.

Two API generations: V1 addresses ``(card_id, device_id)``; V2 (``dcmi_interface_api_v2.h``,
Ascend 950 "A5") addresses one ``dev_id`` (V1's logic id) and a V2-only driver refuses every V1
entry point, ``dcmi_init`` included. :meth:`Dcmi.init` falls back to ``dcmiv2_init`` when
``dcmi_init`` is refused, as gpustack-runtime and the reference do; from then on each call goes to
its ``dcmiv2_*`` counterpart, with V2 device ``d`` presented as card ``d``, chip 0 (the
reference's translation). V2 has no driver-version, logic-id or non-HBM memory call.

One call writes: ``dcmi_set_device_share_enable``, the chip's container-share flag, which the
driver must have on before a second container may open the chip. DCMI allows it only as root on
the physical machine (``OPER_NOT_PERMITTED`` otherwise, e.g. from an unprivileged container).
"""

from __future__ import annotations

import ctypes
from typing import Any

from agent.devices.libs import clib

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
DIE_TYPE_DDIE = 2
"""The A5 chip's own die, asked for when V2 refuses the virtual one."""
MAX_CARDS = 64


class ChipInfo(ctypes.Structure):
    _fields_ = [
        ("chip_type", ctypes.c_char * 32),
        ("chip_name", ctypes.c_char * 32),
        ("chip_ver", ctypes.c_char * 32),
        ("aicore_cnt", ctypes.c_uint),
    ]


class ChipInfoV2(ctypes.Structure):
    """``dcmi_chip_info_v2``: V1's fields plus ``npu_name``; the only layout V2 writes."""

    _fields_ = [
        ("chip_type", ctypes.c_char * 32),
        ("chip_name", ctypes.c_char * 32),
        ("chip_ver", ctypes.c_char * 32),
        ("aicore_cnt", ctypes.c_uint),
        ("npu_name", ctypes.c_char * 32),
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
    """DCMI calls returning plain values, through V1 or, after :meth:`init` fell back, V2."""

    def __init__(self, library: Any) -> None:
        super().__init__(library, CODES)
        self.v2 = False
        """Whether the driver answered only the V2 API (set by :meth:`init`)."""

    def init(self) -> None:
        """``dcmi_init``; when the driver refuses it, ``dcmiv2_init``.

        :raises clib.LibError: both refused (the V1 refusal, the V2 one chained).
        """
        try:
            self.call("dcmi_init")
            self.v2 = False
        except clib.LibError as v1:
            try:
                self.call("dcmiv2_init")
            except clib.LibError as v2:
                raise v1 from v2
            self.v2 = True

    def _v2(self, name: str, card: int, *args: Any) -> None:
        self.call("dcmiv2_" + name, card, *args)

    def driver_version(self) -> str:
        if self.v2:
            raise self.codes.error("dcmiv2_get_driver_version", NOT_SUPPORT, "V2 has no such call")
        buf = ctypes.create_string_buffer(64)
        self.call("dcmi_get_driver_version", buf, 64)
        return clib.text(buf)

    def card_list(self) -> list[int]:
        """Card ids (V2: device ids, each presented as a one-chip card)."""
        count = ctypes.c_int(0)
        cards = (ctypes.c_int * MAX_CARDS)()
        if self.v2:
            self.call("dcmiv2_get_device_list", cards, ctypes.byref(count), MAX_CARDS)
        else:
            self.call("dcmi_get_card_list", ctypes.byref(count), cards, MAX_CARDS)
        return list(cards[: max(min(count.value, MAX_CARDS), 0)])

    def device_count(self, card: int) -> int:
        if self.v2:
            return 1
        count = ctypes.c_int(0)
        self.call("dcmi_get_device_num_in_card", card, ctypes.byref(count))
        return count.value

    def unit_type(self, card: int, device: int) -> int:
        unit = ctypes.c_uint(0)
        if self.v2:
            self._v2("get_device_type", card, ctypes.byref(unit))
        else:
            self.call("dcmi_get_device_type", card, device, ctypes.byref(unit))
        return unit.value

    def logic_id(self, card: int, device: int) -> int:
        if self.v2:
            return card  # V2's device id is V1's logic id
        logic = ctypes.c_uint(0)
        self.call("dcmi_get_device_logic_id", ctypes.byref(logic), card, device)
        return logic.value

    def physical_id(self, logic_id: int) -> int:
        phy = ctypes.c_uint(0)
        if self.v2:
            self._v2("get_chip_phy_id_by_dev_id", logic_id, ctypes.byref(phy))
        else:
            self.call("dcmi_get_device_phyid_from_logicid", logic_id, ctypes.byref(phy))
        return phy.value

    def chip_info(self, card: int, device: int) -> tuple[str, int]:
        """``(chip name, AI cores)``: ``("910B2", 24)``."""
        if self.v2:
            wide = ChipInfoV2()
            self._v2("get_device_chip_info", card, ctypes.byref(wide))
            return clib.text(wide.chip_name), int(wide.aicore_cnt)
        info = ChipInfo()
        self.call("dcmi_get_device_chip_info", card, device, ctypes.byref(info))
        return clib.text(info.chip_name), int(info.aicore_cnt)

    def die_id(self, card: int, device: int) -> tuple[int, ...]:
        """The chip's die id: five 32-bit words, the chip's only unique identity (V2: the
        virtual die, else the A5's own die, in the reference's order)."""
        die = DieId()
        if not self.v2:
            self.call("dcmi_get_device_die_v2", card, device, DIE_TYPE_VDIE, ctypes.byref(die))
            return tuple(int(w) for w in die.soc_die)
        try:
            self._v2("get_device_die_id", card, DIE_TYPE_VDIE, ctypes.byref(die))
        except clib.LibError:
            self._v2("get_device_die_id", card, DIE_TYPE_DDIE, ctypes.byref(die))
        return tuple(int(w) for w in die.soc_die)

    def pci_bus_id(self, card: int, device: int) -> str:
        info = PcieInfoAll()
        if self.v2:
            self._v2("get_device_pcie_info", card, ctypes.byref(info))
        else:
            self.call("dcmi_get_device_pcie_info_v2", card, device, ctypes.byref(info))
        return f"{info.domain:04x}:{info.bdf_busid:02x}:{info.bdf_deviceid:02x}.{info.bdf_funcid:x}"

    def memory(self, card: int, device: int) -> tuple[int, int]:
        """``(total, used)`` MiB: HBM when the chip has it, else the DDR figures of v3 (V2 has
        the HBM call only)."""
        hbm = HbmInfo()
        if self.v2:
            self._v2("get_device_hbm_info", card, ctypes.byref(hbm))
            return int(hbm.memory_size), int(hbm.memory_usage)
        try:
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
        if self.v2:
            self._v2("get_device_utilization_rate", card, UTILIZATION_AICORE, ctypes.byref(rate))
        else:
            args = (card, device, UTILIZATION_AICORE, ctypes.byref(rate))
            self.call("dcmi_get_device_utilization_rate", *args)
        return rate.value

    def temperature(self, card: int, device: int) -> int:
        temp = ctypes.c_int(0)
        if self.v2:
            self._v2("get_device_temperature", card, ctypes.byref(temp))
        else:
            self.call("dcmi_get_device_temperature", card, device, ctypes.byref(temp))
        return temp.value

    def power_deciwatts(self, card: int, device: int) -> int:
        """Power drawn in 0.1 W (not W, not mW)."""
        power = ctypes.c_int(0)
        if self.v2:
            self._v2("get_device_power_info", card, ctypes.byref(power))
        else:
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

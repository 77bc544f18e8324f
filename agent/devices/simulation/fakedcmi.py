"""A simulated ``libdcmi.so`` built from a profile's ``ascend`` section.

Answers the DCMI V1 calls :mod:`agent.devices.libs.dcmi` makes, with DCMI's units (MB, 0.1 W) and
its traps: the logic-id call takes its output first, DDR chips answer the HBM call with size 0,
and a card listed in ``mcuCards`` reports an MCU unit after its chips (type 1), which refuses the
per-chip calls with ``NOT_SUPPORT`` as the real MCU does for power.

The container-share flag is the one piece of state a caller can change: every chip starts with it
off (:attr:`SimulatedDcmi.shared` holds it by chip position), and a chip's ``faults`` can make
the set call fail (``OPER_NOT_PERMITTED``, as outside the physical machine's root).

With ``api: 2`` it is a V2-only driver (Ascend 950): every V1 entry point answers ``NOT_SUPPORT``
and the ``dcmiv2_*`` calls address a chip by its logic id; with ``api: 1`` it exports no V2 call.
"""

from __future__ import annotations

from typing import Any

from agent.devices.libs import dcmi
from agent.devices.simulation.fakelib import SimulatedLibrary, put, put_text, written
from agent.devices.simulation.profiles import AscendChip, AscendHost

_UNIT_MCU = 1


def _pcie(chip: AscendChip, info: Any) -> None:
    domain, bus, rest = chip.bus_id.split(":")
    dev, fn = rest.split(".")
    out = written(info, "dcmi_pcie_info_all")
    out.venderid, out.deviceid = 0x19E5, chip.pci_device_id
    out.domain, out.bdf_busid = int(domain, 16), int(bus, 16)
    out.bdf_deviceid, out.bdf_funcid = int(dev, 16), int(fn, 16)


def _hbm(chip: AscendChip, info: Any) -> None:
    out = written(info, "dcmi_hbm_info")
    out.memory_size = chip.memory_total_mib if chip.hbm else 0
    out.memory_usage = chip.memory_used_mib if chip.hbm else 0
    out.temp = chip.temperature_c


class SimulatedDcmi(SimulatedLibrary):
    CODES = dcmi.CODES
    LOST = "DEVICE_NOT_EXIST"
    UNINITIALIZED = "UNINITIALIZED"

    def __init__(self, host: AscendHost) -> None:
        super().__init__(host.init_error, [c.faults for c in host.chips])
        self.host = host
        self.chips = host.chips
        self.shared = [False] * len(host.chips)
        """Each chip's container-share flag, by position; the driver starts with it off."""
        self._cards: list[int] = list(dict.fromkeys(c.card_id for c in host.chips))
        for card in host.mcu_cards:
            if card not in self._cards:
                self._cards.append(card)

    def _find(self, name: str, card: int, device: int) -> tuple[int, AscendChip | None]:
        """Status and chip for ``(card, device)``; an MCU or unknown slot answers no chip."""
        for position, chip in enumerate(self.chips):
            if chip.card_id == card and chip.device_id == device:
                return self._card(name, position), chip
        self.calls.append((name, None))
        if not self.initialized:
            return dcmi.UNINITIALIZED, None
        return (dcmi.NOT_SUPPORT if card in self.host.mcu_cards else dcmi.DEVICE_NOT_EXIST), None

    def __getattribute__(self, name: str) -> Any:
        api = object.__getattribute__(self, "host").api
        if name.startswith("dcmiv2_") and api != 2:
            raise AttributeError(name)  # a V1 driver's library exports no V2 call
        if name.startswith("dcmi_") and api == 2:
            calls = object.__getattribute__(self, "calls")
            return lambda *args: calls.append((name, None)) or dcmi.NOT_SUPPORT
        return object.__getattribute__(self, name)

    # -- system --------------------------------------------------------------------------------

    def dcmi_init(self) -> int:
        return self._init("dcmi_init")

    def dcmi_get_driver_version(self, buffer: Any, size: int) -> int:
        status = self._system("dcmi_get_driver_version")
        if status or self.host.driver_version is None:
            return status or dcmi.NOT_SUPPORT
        return put_text(buffer, self.host.driver_version, size) and -8001

    def dcmi_get_card_list(self, count: Any, cards: Any, size: int) -> int:
        status = self._system("dcmi_get_card_list")
        if status:
            return status
        for i, card in enumerate(self._cards[:size]):
            cards[i] = card
        put(count, len(self._cards))
        return 0

    def dcmi_get_device_num_in_card(self, card: int, count: Any) -> int:
        status = self._system("dcmi_get_device_num_in_card")
        if status:
            return status
        chips = sum(1 for c in self.chips if c.card_id == card)
        put(count, chips + (1 if card in self.host.mcu_cards else 0))
        return 0

    # -- per chip ------------------------------------------------------------------------------

    def dcmi_get_device_type(self, card: int, device: int, unit: Any) -> int:
        status, chip = self._find("dcmi_get_device_type", card, device)
        if chip is None and status == dcmi.NOT_SUPPORT:
            put(unit, _UNIT_MCU)
            return 0
        if status == 0:
            put(unit, dcmi.UNIT_NPU)
        return status

    def dcmi_get_device_logic_id(self, logic: Any, card: int, device: int) -> int:
        status, chip = self._find("dcmi_get_device_logic_id", card, device)
        if status == 0 and chip is not None:
            put(logic, chip.logic_id)
        return status

    def dcmi_get_device_phyid_from_logicid(self, logic: int, phy: Any) -> int:
        for position, chip in enumerate(self.chips):
            if chip.logic_id == logic:
                status = self._card("dcmi_get_device_phyid_from_logicid", position)
                if status == 0:
                    put(phy, chip.physical_id)
                return status
        return -8007

    def dcmi_get_card_id_device_id_from_phyid(self, card: Any, device: Any, phy: int) -> int:
        for position, chip in enumerate(self.chips):
            if chip.physical_id == phy:
                status = self._card("dcmi_get_card_id_device_id_from_phyid", position)
                if status == 0:
                    put(card, chip.card_id)
                    put(device, chip.device_id)
                return status
        self.calls.append(("dcmi_get_card_id_device_id_from_phyid", None))
        return -8007 if self.initialized else dcmi.UNINITIALIZED

    def dcmi_get_device_share_enable(self, card: int, device: int, flag: Any) -> int:
        status, chip = self._find("dcmi_get_device_share_enable", card, device)
        if status == 0 and chip is not None:
            put(flag, 1 if self.shared[self.chips.index(chip)] else 0)
        return status

    def dcmi_set_device_share_enable(self, card: int, device: int, flag: int) -> int:
        status, chip = self._find("dcmi_set_device_share_enable", card, device)
        if status == 0 and chip is not None:
            if flag not in (0, 1):
                return -8001
            self.shared[self.chips.index(chip)] = flag == 1
        return status

    def dcmi_get_device_chip_info(self, card: int, device: int, info: Any) -> int:
        status, chip = self._find("dcmi_get_device_chip_info", card, device)
        if status == 0 and chip is not None:
            out = written(info, "dcmi_chip_info")
            out.chip_type = b"Ascend"
            out.chip_name = chip.chip_name.encode()
            out.chip_ver = b"V1"
            out.aicore_cnt = chip.aicore_count
        return status

    def dcmi_get_device_die_v2(self, card: int, device: int, kind: int, die: Any) -> int:
        status, chip = self._find("dcmi_get_device_die_v2", card, device)
        if status == 0 and chip is not None:
            out = written(die, "dcmi_die_id")
            for i, word in enumerate(chip.die_id):
                out.soc_die[i] = word
        return status

    def dcmi_get_device_pcie_info_v2(self, card: int, device: int, info: Any) -> int:
        status, chip = self._find("dcmi_get_device_pcie_info_v2", card, device)
        if status == 0 and chip is not None:
            _pcie(chip, info)
        return status

    def dcmi_get_device_hbm_info(self, card: int, device: int, info: Any) -> int:
        status, chip = self._find("dcmi_get_device_hbm_info", card, device)
        if status == 0 and chip is not None:
            _hbm(chip, info)
        return status

    def dcmi_get_device_memory_info_v3(self, card: int, device: int, info: Any) -> int:
        status, chip = self._find("dcmi_get_device_memory_info_v3", card, device)
        if status == 0 and chip is not None:
            out = written(info, "dcmi_get_memory_info_stru")
            out.memory_size = chip.memory_total_mib
            out.memory_available = chip.memory_total_mib - chip.memory_used_mib
        return status

    def dcmi_get_device_utilization_rate(self, card: int, device: int, kind: int, rate: Any) -> int:
        status, chip = self._find("dcmi_get_device_utilization_rate", card, device)
        if status == 0 and chip is not None:
            if kind != dcmi.UTILIZATION_AICORE:
                return dcmi.NOT_SUPPORT
            put(rate, chip.aicore_utilization)
        return status

    def dcmi_get_device_temperature(self, card: int, device: int, temp: Any) -> int:
        status, chip = self._find("dcmi_get_device_temperature", card, device)
        if status == 0 and chip is not None:
            put(temp, chip.temperature_c)
        return status

    def dcmi_get_device_power_info(self, card: int, device: int, power: Any) -> int:
        status, chip = self._find("dcmi_get_device_power_info", card, device)
        if status == 0 and chip is not None:
            put(power, chip.power_deciwatts)
        return status

    # -- V2 (a chip addressed by its logic id) -------------------------------------------------

    def _v2(self, name: str, dev: int) -> tuple[int, AscendChip | None]:
        for chip in self.chips:
            if chip.logic_id == dev:
                return self._find(name, chip.card_id, chip.device_id)
        self.calls.append((name, None))
        return (dcmi.DEVICE_NOT_EXIST if self.initialized else dcmi.UNINITIALIZED), None

    def dcmiv2_init(self) -> int:
        return self._init("dcmiv2_init")

    def dcmiv2_get_device_list(self, devices: Any, count: Any, size: int) -> int:
        status = self._system("dcmiv2_get_device_list")
        if status:
            return status
        for i, chip in enumerate(self.chips[:size]):
            devices[i] = chip.logic_id
        put(count, len(self.chips))
        return 0

    def dcmiv2_get_device_type(self, dev: int, unit: Any) -> int:
        status, _ = self._v2("dcmiv2_get_device_type", dev)
        if status == 0:
            put(unit, dcmi.UNIT_NPU)
        return status

    def dcmiv2_get_chip_phy_id_by_dev_id(self, dev: int, phy: Any) -> int:
        status, chip = self._v2("dcmiv2_get_chip_phy_id_by_dev_id", dev)
        if status == 0 and chip is not None:
            put(phy, chip.physical_id)
        return status

    def dcmiv2_get_device_chip_info(self, dev: int, info: Any) -> int:
        status, chip = self._v2("dcmiv2_get_device_chip_info", dev)
        if status == 0 and chip is not None:
            out = written(info, "dcmi_chip_info_v2")
            out.chip_type, out.chip_name = b"Ascend", chip.chip_name.encode()
            out.aicore_cnt, out.npu_name = chip.aicore_count, chip.chip_name.encode()
        return status

    def dcmiv2_get_device_die_id(self, dev: int, kind: int, die: Any) -> int:
        status, chip = self._v2("dcmiv2_get_device_die_id", dev)
        if status == 0 and chip is not None:
            if kind != dcmi.DIE_TYPE_VDIE:
                return -8001
            out = written(die, "dcmi_die_id")
            for i, word in enumerate(chip.die_id):
                out.soc_die[i] = word
        return status

    def dcmiv2_get_device_pcie_info(self, dev: int, info: Any) -> int:
        status, chip = self._v2("dcmiv2_get_device_pcie_info", dev)
        if status == 0 and chip is not None:
            _pcie(chip, info)
        return status

    def dcmiv2_get_device_hbm_info(self, dev: int, info: Any) -> int:
        status, chip = self._v2("dcmiv2_get_device_hbm_info", dev)
        if status == 0 and chip is not None:
            _hbm(chip, info)
        return status

    def dcmiv2_get_device_utilization_rate(self, dev: int, kind: int, rate: Any) -> int:
        status, chip = self._v2("dcmiv2_get_device_utilization_rate", dev)
        if status == 0 and chip is not None:
            if kind != dcmi.UTILIZATION_AICORE:
                return dcmi.NOT_SUPPORT
            put(rate, chip.aicore_utilization)
        return status

    def dcmiv2_get_device_temperature(self, dev: int, temp: Any) -> int:
        status, chip = self._v2("dcmiv2_get_device_temperature", dev)
        if status == 0 and chip is not None:
            put(temp, chip.temperature_c)
        return status

    def dcmiv2_get_device_power_info(self, dev: int, power: Any) -> int:
        status, chip = self._v2("dcmiv2_get_device_power_info", dev)
        if status == 0 and chip is not None:
            put(power, chip.power_deciwatts)
        return status

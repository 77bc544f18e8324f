"""The telemetry part of the simulated pynvml: the DCGM exporter's default fields NVML gives.

Clocks, encoder and decoder use, PCIe throughput and replays, row remapping (Ampere on) or page
retirement (before it), NVLink link state and data counters, and the energy counter. Each value
comes from the card's profile; a field the profile leaves out (``None``) answers
``NOT_SUPPORTED``, as a card without it does. The counters (energy, NVLink data) advance by one
second's worth at every read (energy by the card's power draw at that read), so a scraper
sees them move as on hardware while two simulators read the same number of times (at the same
clock, where a load pattern moves the power) still answer the same.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agent.devices.simulation.fakemig import SimulatedHandle
from agent.devices.simulation.load import Reading
from agent.devices.simulation.nvmlerrors import INVALID_ARGUMENT, NOT_SUPPORTED, NVMLError
from agent.devices.simulation.profiles import NvidiaCard


def _supported(value: Any) -> Any:
    if value is None:
        raise NVMLError(NOT_SUPPORTED)
    return value


class TelemetryCalls:
    """Mixed into :class:`~agent.devices.simulation.fakenvml.SimulatedNvml`."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    NVML_FI_DEV_MEMORY_TEMP = 82

    _reads: dict[tuple[str, int], int]
    """(counter, card index) -> reads so far (energy: mJ added so far); set by the simulator."""

    def _card(self, fn: str, handle: Any, *aliases: str) -> NvidiaCard:
        raise NotImplementedError  # SimulatedNvml's

    def _now(self, card: NvidiaCard) -> Reading:
        raise NotImplementedError  # SimulatedNvml's

    def _seconds(self, counter: str, handle: Any) -> int:
        """One more simulated second of ``counter`` on the card of ``handle``."""
        key = (counter, int(handle.index))
        self._reads[key] = self._reads.get(key, 0) + 1
        return self._reads[key]

    def nvmlDeviceGetEncoderUtilization(self, handle: SimulatedHandle) -> list[int]:
        card = self._card("nvmlDeviceGetEncoderUtilization", handle)
        return [_supported(card.encoder_percent), 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: SimulatedHandle) -> list[int]:
        card = self._card("nvmlDeviceGetDecoderUtilization", handle)
        return [_supported(card.decoder_percent), 167000]

    def nvmlDeviceGetClockInfo(self, handle: SimulatedHandle, type: int) -> int:
        card = self._card("nvmlDeviceGetClockInfo", handle)
        if type == self.NVML_CLOCK_SM:
            return int(_supported(card.sm_clock_mhz))
        if type == self.NVML_CLOCK_MEM:
            return int(_supported(card.memory_clock_mhz))
        raise NVMLError(NOT_SUPPORTED)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimulatedHandle) -> int:
        """One more second at the card's draw now (which a load pattern moves): a counter that
        never goes back, whatever the power does."""
        card = self._card("nvmlDeviceGetTotalEnergyConsumption", handle)
        start = int(_supported(card.energy_mj))
        key = ("energy", int(handle.index))
        self._reads[key] = self._reads.get(key, 0) + (self._now(card).power_mw or 0)  # mW x 1 s
        return start + self._reads[key]

    def nvmlDeviceGetPcieThroughput(self, device: SimulatedHandle, counter: int) -> int:
        card = self._card("nvmlDeviceGetPcieThroughput", device)
        if counter == self.NVML_PCIE_UTIL_TX_BYTES:
            return int(_supported(card.pcie_tx_kbps))
        if counter == self.NVML_PCIE_UTIL_RX_BYTES:
            return int(_supported(card.pcie_rx_kbps))
        raise NVMLError(INVALID_ARGUMENT)

    def nvmlDeviceGetPcieReplayCounter(self, handle: SimulatedHandle) -> int:
        return int(_supported(self._card("nvmlDeviceGetPcieReplayCounter", handle).pcie_replays))

    def nvmlDeviceGetRemappedRows(self, device: SimulatedHandle) -> tuple[int, int, int, int]:
        card = self._card("nvmlDeviceGetRemappedRows", device)
        correctable, uncorrectable, failed = _supported(card.remapped_rows)
        return correctable, uncorrectable, 0, int(failed)

    def nvmlDeviceGetRetiredPages(self, device: SimulatedHandle, sourceFilter: int) -> list[int]:
        card = self._card("nvmlDeviceGetRetiredPages", device)
        single, double = _supported(card.retired_pages)
        count = (
            double
            if sourceFilter == self.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            else single
        )
        return [0x1000 * (i + 1) for i in range(count)]  # page addresses

    def nvmlDeviceGetNvLinkState(self, device: SimulatedHandle, link: int) -> int:
        card = self._card("nvmlDeviceGetNvLinkState", device)
        if not card.nvlink_links:
            raise NVMLError(NOT_SUPPORTED)
        if not 0 <= link < self.NVML_NVLINK_MAX_LINKS:
            raise NVMLError(INVALID_ARGUMENT)
        return 1 if link < card.nvlink_links else 0  # NVML_FEATURE_ENABLED / DISABLED

    def nvmlDeviceGetFieldValues(self, handle: SimulatedHandle, fieldIds: list[int]) -> list[Any]:
        card = self._card("nvmlDeviceGetFieldValues", handle)
        data = (
            self.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            self.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        )
        out = []
        for field in fieldIds:
            value: int | None = None
            if field in data and card.nvlink_links:
                value = card.nvlink_kibps * self._seconds(f"nvlink{field}", handle)
            elif field == self.NVML_FI_DEV_MEMORY_TEMP:
                value = card.memory_temperature_c
            kind = 1 if field == self.NVML_FI_DEV_MEMORY_TEMP else 3  # uint, unsigned long long
            member = "uiVal" if kind == 1 else "ullVal"
            out.append(SimpleNamespace(
                fieldId=field, nvmlReturn=NOT_SUPPORTED if value is None else 0, valueType=kind,
                value=SimpleNamespace(**{member: value or 0}),
            ))  # fmt: skip
        return out

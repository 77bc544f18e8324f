"""A simulated ``libmxsml.so`` built from a profile's ``metax`` section.

MXSML's shapes and traps: the device count is a return value, memory is KB, temperature is
°C × 100, and the board's power is negotiated in two calls (the first, with no array, answers
``INSUFFICIENT_SIZE`` and the number of supply ways).
"""

from __future__ import annotations

from typing import Any

from agent.devices.libs import mxsml
from agent.devices.simulation.fakelib import SimulatedLibrary, put, put_text, target, written
from agent.devices.simulation.profiles import MetaxCard, MetaxHost

_INVALID_ID = 6


class SimulatedMxsml(SimulatedLibrary):
    CODES = mxsml.CODES
    LOST = "NO_DEVICE"
    UNINITIALIZED = "FAILURE"

    def __init__(self, host: MetaxHost) -> None:
        super().__init__(host.init_error, [c.faults for c in host.cards])
        self.host = host

    def _gate(self, name: str, device: int) -> tuple[int, MetaxCard | None]:
        if not 0 <= device < len(self.host.cards):
            self.calls.append((name, None))
            return _INVALID_ID, None
        return self._card(name, device), self.host.cards[device]

    def mxSmlInit(self) -> int:
        return self._init("mxSmlInit")

    def mxSmlGetMacaVersion(self, buffer: Any, size: Any) -> int:
        status = self._system("mxSmlGetMacaVersion")
        if status or self.host.maca_version is None:
            return status or mxsml.NOT_SUPPORTED
        room = target(size).value
        return mxsml.INSUFFICIENT_SIZE if put_text(buffer, self.host.maca_version, room) else 0

    def mxSmlGetDeviceCount(self) -> int:
        self.calls.append(("mxSmlGetDeviceCount", None))
        return len(self.host.cards) if self.initialized else 0

    def mxSmlGetDeviceInfo(self, device: int, info: Any) -> int:
        status, card = self._gate("mxSmlGetDeviceInfo", device)
        if status == 0 and card is not None:
            out = written(info, "mxSmlDeviceInfo_t")
            out.deviceId, out.brand, out.mode = device, card.brand, card.mode
            out.bdfId = card.bus_id.encode()
            out.uuid = card.uuid.encode()
            out.deviceName = card.name.encode()
        return status

    def mxSmlGetDeviceVersion(self, device: int, unit: int, buffer: Any, size: Any) -> int:
        status, card = self._gate("mxSmlGetDeviceVersion", device)
        if status or card is None:
            return status
        if unit != mxsml.VERSION_DRIVER:
            return mxsml.NOT_SUPPORTED
        room = target(size).value
        return mxsml.INSUFFICIENT_SIZE if put_text(buffer, card.driver_version, room) else 0

    def mxSmlGetMemoryInfo(self, device: int, info: Any) -> int:
        status, card = self._gate("mxSmlGetMemoryInfo", device)
        if status == 0 and card is not None:
            out = written(info, "mxSmlMemoryInfo_t")
            out.vramTotal = out.visVramTotal = card.vram_total_kb
            out.vramUse = out.visVramUse = card.vram_used_kb
        return status

    def mxSmlGetTemperatureInfo(self, device: int, sensor: int, value: Any) -> int:
        status, card = self._gate("mxSmlGetTemperatureInfo", device)
        if status == 0 and card is not None:
            put(value, card.hotspot_centidegrees)
        return status

    def mxSmlGetBoardPowerInfo(self, device: int, size: Any, ways: Any) -> int:
        status, card = self._gate("mxSmlGetBoardPowerInfo", device)
        if status or card is None:
            return status
        room = target(size).value
        put(size, len(card.board_ways_mw))
        if ways is None or room < len(card.board_ways_mw):
            return mxsml.INSUFFICIENT_SIZE
        array = target(ways) if type(ways).__name__ == "CArgObject" else ways
        for i, power in enumerate(card.board_ways_mw):
            array[i].power = power
        return 0

    def mxSmlGetDeviceIpUsage(self, device: int, ip: int, value: Any) -> int:
        status, card = self._gate("mxSmlGetDeviceIpUsage", device)
        if status == 0 and card is not None:
            if ip != mxsml.USAGE_XCORE:
                return mxsml.NOT_SUPPORTED
            put(value, card.xcore_percent)
        return status

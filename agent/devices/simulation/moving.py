"""The eight other manufacturers' simulated cards move as the simulated NVIDIA ones do.

A profile section with a ``load`` pattern (:class:`~.load.LoadPattern`) and a simulator clock
makes each card's utilization, memory used, temperature and power follow the pattern
(:func:`.load.reading`, a pure function of seed, card and time), in the vendor's own units:

- the library-read manufacturers (Ascend, Cambricon, Hygon, Iluvatar, MetaX, Moore Threads,
  T-Head): their simulated library is handed a :class:`MovingSection`, which answers its cards
  moved to the clock's time; the simulators themselves are unchanged;
- AMD, read from sysfs: :class:`MovingHostFS` answers the four usage attributes of the
  materialized tree at the clock's time.

Per manufacturer, :data:`MOTIONS` says which fields move and their units. A card is keyed by its
identity (UUID, unique id, or card and chip for Ascend), so two cards never move in step and a
card moves the same way in every run with the same seed. Invariants: a reading the profile leaves
unsupported (``None``, or a file the tree lacks) stays unsupported; identity fields never move.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, overload

import msgspec

from agent.devices.hostfs import HostFS
from agent.devices.simulation.load import LoadPattern, Reading, reading
from agent.devices.simulation.profiles import AmdHost

__all__ = ["MOTIONS", "Motion", "MovingHostFS", "MovingSection", "moved", "moving"]

Clock = Callable[[], float]


@dataclass(frozen=True)
class Motion:
    """Where a manufacturer's card keeps each moving figure, and in which unit."""

    cards: str
    """The section's field listing the cards (``cards``; Ascend: ``chips``)."""
    key: Callable[[Any], str]
    utilization: str
    memory_used: str
    memory_total: str
    temperature: str
    temperature_per_c: int
    """Units of ``temperature`` per °C (1, 100 for MetaX, 1000 for m°C)."""
    power: tuple[str, ...]
    """Fields holding power; the first is the draw, the others (MetaX's supply ways) share it."""
    power_per_mw: float
    """Units of ``power`` per mW (0.01 for DCMI's 0.1 W, 0.001 for W, 1000 for µW)."""


def _uuid(card: Any) -> str:
    return str(card.uuid)


MOTIONS: Final[dict[str, Motion]] = {
    "ascend": Motion("chips", lambda c: f"ascend/{c.card_id}/{c.device_id}/{c.die_id}",
                     "aicore_utilization", "memory_used_mib", "memory_total_mib",
                     "temperature_c", 1, ("power_deciwatts",), 0.01),
    "cambricon": Motion("cards", _uuid, "utilization_percent", "memory_used_mib",
                        "memory_total_mib", "chip_temperature_c", 1, ("power_w",), 0.001),
    "hygon": Motion("cards", lambda c: f"hygon/{c.unique_id}", "busy_percent",
                    "vram_used_bytes", "vram_total_bytes", "edge_temperature_mc", 1000,
                    ("power_average_uw", "power_uw"), 1000.0),
    "iluvatar": Motion("cards", _uuid, "utilization_percent", "memory_used_mib",
                       "memory_total_mib", "temperature_c", 1, ("power_mw",), 1.0),
    "metax": Motion("cards", _uuid, "xcore_percent", "vram_used_kb", "vram_total_kb",
                    "hotspot_centidegrees", 100, ("board_ways_mw",), 1.0),
    "mthreads": Motion("cards", _uuid, "utilization_percent", "memory_used_mib",
                       "memory_total_mib", "temperature_c", 1, ("power_mw",), 1.0),
    "thead": Motion("cards", _uuid, "utilization_percent", "memory_used_mib",
                    "memory_total_mib", "temperature_c", 1, ("power_mw",), 1.0),
}  # fmt: skip
"""The library-read manufacturers' cards, field by field."""


def _now(motion: Motion, pattern: LoadPattern, card: Any, t: float) -> Reading:
    return reading(
        pattern, motion.key(card), t,
        level_percent=getattr(card, motion.utilization) or 0,
        memory_mib=getattr(card, motion.memory_total),
        temperature=getattr(card, motion.temperature) is not None,
        power=getattr(card, motion.power[0]) is not None,
    )  # fmt: skip


def _power(motion: Motion, card: Any, mw: int) -> dict[str, Any]:
    """The power fields at ``mw`` in the card's unit; MetaX's ways keep their proportions."""
    out: dict[str, Any] = {}
    for name in motion.power:
        value = getattr(card, name)
        if isinstance(value, tuple):
            total = sum(value) or 1
            out[name] = tuple(round(mw * way / total) for way in value)
        elif value is not None:
            out[name] = round(mw * motion.power_per_mw)
    return out


def moved(motion: Motion, pattern: LoadPattern, card: Any, t: float) -> Any:
    """``card`` with its usage at ``t`` (pure; identity and capacity unchanged)."""
    now = _now(motion, pattern, card, t)
    changes: dict[str, Any] = {
        motion.utilization: now.utilization_percent,
        motion.memory_used: now.memory_used_mib,  # in the total's unit: a fraction of it
    }
    if now.temperature_c is not None:
        changes[motion.temperature] = now.temperature_c * motion.temperature_per_c
    if now.power_mw is not None:
        changes |= _power(motion, card, now.power_mw)
    return msgspec.structs.replace(card, **changes)


class MovingCards(Sequence[Any]):
    """A section's cards, each read moved to the clock's time when it is indexed."""

    def __init__(self, cards: Sequence[Any], motion: Motion, pattern: LoadPattern, clock: Clock):
        self._cards, self._motion, self._pattern, self._clock = cards, motion, pattern, clock

    def __len__(self) -> int:
        return len(self._cards)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        t = self._clock()
        if isinstance(index, slice):
            return [moved(self._motion, self._pattern, c, t) for c in self._cards[index]]
        return moved(self._motion, self._pattern, self._cards[index], t)

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """By identity, not by value: the same card read at another time has other figures."""
        key = self._motion.key(value)
        for position, card in enumerate(self._cards[start:stop], start):
            if self._motion.key(card) == key:
                return position
        raise ValueError(f"{key} is not a card of this section")


class MovingSection:
    """A library-read manufacturer's profile section whose cards move (everything else as is)."""

    def __init__(self, section: Any, motion: Motion, clock: Clock) -> None:
        self._section = section
        self._cards = MovingCards(getattr(section, motion.cards), motion, section.load, clock)
        self._field = motion.cards

    def __getattr__(self, name: str) -> Any:
        if name == object.__getattribute__(self, "_field"):
            return object.__getattribute__(self, "_cards")
        return getattr(object.__getattribute__(self, "_section"), name)


def moving(key: str, section: Any, clock: Clock | None) -> Any:
    """``section`` as ``key``'s simulator should see it: moving when it has a pattern and there
    is a clock, else itself."""
    if clock is None or getattr(section, "load", None) is None or key not in MOTIONS:
        return section
    return MovingSection(section, MOTIONS[key], clock)


_AMD_ATTRIBUTE = re.compile(
    r"^/sys/bus/pci/devices/(?P<bdf>[^/]+)/(?:hwmon/hwmon\d+/)?"
    r"(?P<name>mem_info_vram_used|gpu_busy_percent|temp1_input|power1_average)$"
)


@dataclass(frozen=True)
class MovingHostFS(HostFS):
    """The materialized tree, with AMD's usage attributes read at the clock's time."""

    amd: AmdHost | None = None
    clock: Clock | None = None

    def read_text(self, host_path: str) -> str | None:
        text = super().read_text(host_path)
        match = _AMD_ATTRIBUTE.match(host_path)
        if text is None or match is None or self.amd is None or self.amd.load is None:
            return text
        cards = [c for c in self.amd.cards if c.bus_id.lower() == match["bdf"]]
        if not cards or self.clock is None:
            return text
        card = cards[0]
        now = reading(
            self.amd.load, card.unique_id or card.bus_id, self.clock(),
            level_percent=card.busy_percent or 0, memory_mib=card.vram_total_bytes,
        )  # fmt: skip
        return str(
            {
                "mem_info_vram_used": now.memory_used_mib,  # bytes: a fraction of the total's
                "gpu_busy_percent": now.utilization_percent,
                "temp1_input": (now.temperature_c or 0) * 1000,
                "power1_average": (now.power_mw or 0) * 1000,
            }[match["name"]]
        )

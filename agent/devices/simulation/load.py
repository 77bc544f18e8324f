"""A simulated card's load over time: a pure function of (card, time, seed), so a node moves.

A profile's readings are one snapshot. A demo or a dashboard shows a node that never changes
and charts that are flat lines, so a profile may add a ``load`` pattern
(:class:`LoadPattern`): each card's utilization, memory used, temperature and power then follow
a smooth periodic load with seeded noise, read at the simulator's clock. The same (card, time,
seed) always gives the same readings, so a test that injects the clock asserts exact figures.

The shape, per card (``key`` is its UUID):

- ``busy(t)`` in [0, 1]: half the card's profile utilization (its usual level) plus half a
  wave of two sines (one ``period_s`` long, one about a third of it) at a phase drawn from
  (seed, key), plus noise drawn from (seed, key, whole second) within ``±noise``;
- utilization is ``busy(t)`` in percent; power moves linearly between the pattern's idle and
  peak draw, temperature between its idle and hot figure, both following ``busy`` a few
  seconds late (heat and power lag the work);
- memory used follows a slower wave (three periods long) between ``memory_percent``'s bounds
  of what the card offers (total less reserved), as models load and unload.

Invariants: every reading stays inside the pattern's bounds, which stay inside the bus's
semantic bounds (``bus.bounds``: percent 0-100, Celsius, watts); a reading the profile marks
unsupported (``None``) stays unsupported.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import msgspec

__all__ = ["LoadPattern", "Reading", "busy", "reading"]


class LoadPattern(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """How a profile's cards move; the profile's ``load`` section."""

    seed: int = 0
    period_s: float = 120.0
    """The main wave's length; the memory wave is three times as long."""
    noise: float = 0.08
    """Half-width of the per-second noise on ``busy``, as a fraction of full load."""
    lag_s: float = 6.0
    """How far temperature and power trail the work."""
    temperature_c: tuple[int, int] = (30, 78)
    """Idle and fully-loaded temperature."""
    power_mw: tuple[int, int] = (75_000, 690_000)
    """Idle and fully-loaded power draw."""
    memory_percent: tuple[int, int] = (5, 90)
    """Least and most memory used, in percent of what the card offers."""

    def __post_init__(self) -> None:
        if not self.period_s > 0 or not 0 <= self.noise <= 0.5 or self.lag_s < 0:
            raise ValueError("load: periodS > 0, 0 <= noise <= 0.5, lagS >= 0")
        for name in ("temperature_c", "power_mw", "memory_percent"):
            low, high = getattr(self, name)
            if low > high or low < 0:
                raise ValueError(f"load: {name} must be [low, high], 0 <= low <= high")
        if self.memory_percent[1] > 100 or self.temperature_c[1] > 500:
            raise ValueError("load: memoryPercent <= 100, temperatureC <= 500")


@dataclass(frozen=True)
class Reading:
    utilization_percent: int
    memory_used_mib: int
    temperature_c: int | None
    power_mw: int | None


def _draw(seed: int, key: str, salt: str) -> float:
    """A number in [0, 1) that (seed, key, salt) alone decides."""
    digest = hashlib.blake2b(f"{seed}/{key}/{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _wave(pattern: LoadPattern, key: str, t: float, *, stretch: float = 1.0) -> float:
    """A smooth [0, 1] wave of two sines, its phases drawn from (seed, key)."""
    period = pattern.period_s * stretch
    slow = math.sin(2 * math.pi * (t / period + _draw(pattern.seed, key, f"phase{stretch}")))
    fast = math.sin(
        2 * math.pi * (t / (period * 0.31) + _draw(pattern.seed, key, f"fast{stretch}"))
    )
    return 0.5 + 0.35 * slow + 0.15 * fast


def busy(pattern: LoadPattern, key: str, t: float, level: float) -> float:
    """How loaded the card ``key`` is at ``t`` (seconds), in [0, 1]; ``level`` is its usual load."""
    noise = (2 * _draw(pattern.seed, key, f"noise{math.floor(t)}") - 1) * pattern.noise
    value = 0.5 * min(max(level, 0.0), 1.0) + 0.5 * _wave(pattern, key, t) + noise
    return min(max(value, 0.0), 1.0)


def _between(bounds: tuple[int, int], fraction: float) -> int:
    low, high = bounds
    return round(low + (high - low) * fraction)


def reading(
    pattern: LoadPattern,
    key: str,
    t: float,
    *,
    level_percent: int,
    memory_mib: int,
    temperature: bool = True,
    power: bool = True,
) -> Reading:
    """The card's readings at ``t``; ``memory_mib`` is what it offers (total less reserved)."""
    level = level_percent / 100
    work = busy(pattern, key, t, level)
    late = busy(pattern, key, t - pattern.lag_s, level)
    memory = _wave(pattern, key, t, stretch=3.0)
    low, high = pattern.memory_percent
    return Reading(
        utilization_percent=round(100 * work),
        memory_used_mib=int(memory_mib * (low + (high - low) * memory) / 100),
        temperature_c=_between(pattern.temperature_c, late) if temperature else None,
        power_mw=_between(pattern.power_mw, late) if power else None,
    )

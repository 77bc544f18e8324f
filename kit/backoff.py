"""Capped exponential backoff: one schedule for every retry loop of the project.

The decision (:meth:`Backoff.delay_s`) is pure: the ``attempt``-th wait (0 for the first retry)
is ``first_s * factor ** attempt``, never more than ``cap_s``, and never less than a delay the
peer asked for (``at_least_s``: a ``Retry-After``), itself capped. It takes any attempt number,
however large: a loop that has failed for days still gets ``cap_s`` rather than an
``OverflowError`` from the float power (which ``2.0 ** 1100`` raises). The async part
(:meth:`Backoff.wait`) only sleeps that long, so a loop reads::

    for attempt in itertools.count():
        try:
            return await call()
        except Temporary:
            await schedule.wait(attempt)

A loop keeps its own attempt count (reset on success) and its own choice of which errors to
retry; this module knows neither. Loops that count *failures* (0: none yet, no wait) use
:func:`delay`, the same schedule.

Jitter matters where many processes fail *together*: after a NATS restart every node agent of
a cluster loses its connection in the same millisecond, and without jitter they would all come
back in lock-step, so the server's auth callout meets the whole fleet at once on every round.
:func:`jittered` draws uniformly from the upper half of the delay ("equal jitter"): a retry never
comes much sooner than the plain schedule says, but the herd is spread over half of it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Final

import anyio

__all__ = ["Backoff", "delay", "jittered"]

_MAX_EXPONENT = 64
"""Past this many doublings every useful schedule is at its cap; bounding the exponent keeps
the power finite for any attempt number."""


@dataclass(frozen=True)
class Backoff:
    """``first_s``, then ``factor`` times longer each attempt, at most ``cap_s``.

    Invariants (checked at construction): ``0 <= first_s <= cap_s``, both finite; ``factor >= 1``.
    """

    first_s: float
    cap_s: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.first_s) and math.isfinite(self.cap_s)):
            raise ValueError("backoff delays must be finite")
        if not 0 <= self.first_s <= self.cap_s:
            raise ValueError(f"backoff needs 0 <= first ({self.first_s}) <= cap ({self.cap_s})")
        if not self.factor >= 1:
            raise ValueError(f"backoff factor must be at least 1, not {self.factor}")

    def delay_s(self, attempt: int, *, at_least_s: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based; a negative one is 0).

        ``at_least_s`` (what the peer asked for) lengthens the wait, up to ``cap_s``.
        """
        exponent = min(max(attempt, 0), _MAX_EXPONENT)
        delay = min(self.first_s * self.factor**exponent, self.cap_s)
        if at_least_s is not None and at_least_s > delay:
            delay = min(at_least_s, self.cap_s)
        return float(delay)

    async def wait(self, attempt: int, *, at_least_s: float | None = None) -> float:
        """Sleep :meth:`delay_s` (cancellable like any sleep); returns the seconds slept."""
        delay = self.delay_s(attempt, at_least_s=at_least_s)
        await anyio.sleep(delay)
        return delay


def delay(failures: int, *, first_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures: 0 before the first, then
    ``first_s``, doubling, never more than ``max_s`` (a ``first_s`` above ``max_s`` waits
    ``max_s``): :class:`Backoff` counted by failures."""
    if failures <= 0:
        return 0.0
    return Backoff(min(first_s, max_s), max_s).delay_s(failures - 1)


def jittered(
    failures: int, *, first_s: float, max_s: float, rng: random.Random | None = None
) -> float:
    """:func:`delay`, drawn uniformly from its upper half (``[d/2, d]``).

    ``rng`` makes the draw reproducible in tests; by default the module's shared generator.
    """
    full = delay(failures, first_s=first_s, max_s=max_s)
    return (rng or _RNG).uniform(full / 2, full)


_RNG: Final = random.Random()

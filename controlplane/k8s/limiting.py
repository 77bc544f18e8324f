"""A token bucket: the client-side rate limit of ``--kube-conn-qps`` / ``--kube-conn-burst``.

Pure: :meth:`TokenBucket.reserve` takes a token now and says how long the caller must wait for
it, given the clock; the async client sleeps that long. Reservations queue up fairly because the
bucket may go negative (the next caller waits for every earlier reservation too).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``qps`` tokens a second, at most ``burst`` saved up. ``qps <= 0`` disables the limit."""

    def __init__(
        self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._qps = qps
        self._burst = float(max(1, burst))
        self._clock = clock
        self._tokens = self._burst
        self._at = clock()

    def reserve(self) -> float:
        """Take one token; return the seconds to wait before using it (0 when available now)."""
        if self._qps <= 0:
            return 0.0
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._qps)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self._qps

"""How long to wait before trying again: capped exponential backoff, with or without jitter.

One pure helper for every retry loop that meets a remote peer (bus connections, state reads,
bucket binds, materializations), so they double, cap and spread the same way. Nothing here
sleeps: callers get seconds and await them where they already await.

Jitter matters where many processes fail *together*: after a NATS restart every node agent of
a cluster loses its connection in the same millisecond, and without jitter they would all
come back in lock-step, so the server's auth callout meets the whole fleet at once on every
round. :func:`jittered` draws uniformly from the upper half of the delay ("equal jitter"), so a
retry never comes much sooner than the plain schedule says but the herd is spread over half of
it.
"""

from __future__ import annotations

import random
from typing import Final

__all__ = ["delay", "jittered"]

_MAX_DOUBLINGS: Final = 32
"""Beyond this the cap has long applied; it keeps ``2 ** n`` a small number."""


def delay(failures: int, *, first_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` consecutive failures: 0 before the first failure,
    then ``first_s``, doubling, never more than ``max_s``."""
    if failures <= 0:
        return 0.0
    return float(min(first_s * 2 ** min(failures - 1, _MAX_DOUBLINGS), max_s))


def jittered(
    failures: int, *, first_s: float, max_s: float, rng: random.Random | None = None
) -> float:
    """:func:`delay`, drawn uniformly from its upper half (``[d/2, d]``).

    ``rng`` makes the draw reproducible in tests; by default the module's shared generator.
    """
    full = delay(failures, first_s=first_s, max_s=max_s)
    return (rng or _RNG).uniform(full / 2, full)


_RNG: Final = random.Random()

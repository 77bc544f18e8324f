"""The one backoff schedule: doubling from the first wait, capped, and spread by jitter."""

from __future__ import annotations

import random

import pytest

from kit import backoff


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 0.0), (-3, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (10**6, 30.0)],
)
def test_delay_doubles_from_the_first_wait_up_to_the_cap(failures: int, expected: float) -> None:
    assert backoff.delay(failures, first_s=0.5, max_s=30.0) == expected


def test_jitter_stays_in_the_upper_half_and_spreads_a_herd() -> None:
    """A thousand clients that failed together draw waits between half the delay and all of
    it, and not all the same wait (they would come back in lock-step)."""
    rng = random.Random(31)
    draws = [backoff.jittered(3, first_s=1.0, max_s=30.0, rng=rng) for _ in range(1000)]
    assert all(2.0 <= d <= 4.0 for d in draws)
    assert max(draws) - min(draws) > 1.5
    assert len(set(draws)) > 900


def test_jitter_never_exceeds_the_cap() -> None:
    rng = random.Random(7)
    assert all(
        15.0 <= backoff.jittered(n, first_s=2.0, max_s=30.0, rng=rng) <= 30.0 for n in range(5, 200)
    )

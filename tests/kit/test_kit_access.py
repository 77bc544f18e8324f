"""The authorization seam: bearer tokens and the decision cache (the gate: test_kit_serving)."""

from __future__ import annotations

from collections import Counter

import pytest

from kit import access
from kit.access import CachedAuthorizer, Decision, DecisionCache

pytestmark = pytest.mark.anyio


class Table:
    """Tokens ``good`` (may read everything), ``other`` (nothing); ``down`` makes it unreachable."""

    def __init__(self) -> None:
        self.asked: Counter[tuple[str | None, str]] = Counter()
        self.down = False

    async def allowed(self, token: str | None, path: str) -> Decision:
        self.asked[(token, path)] += 1
        if self.down:
            return Decision("unavailable", "authorization unavailable: reviewer away")
        if token == "good":
            return Decision("allowed")
        if token == "other":
            return Decision("forbidden", f"Forbidden (user=other, verb=get, path={path})")
        return Decision("unauthenticated", "Unauthorized: invalid bearer token")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer abc.def", "abc.def"),
        ("bearer   abc ", "abc"),
        ("Basic dXNlcjpwdw==", None),
        ("Bearer", None),
        ("Bearer a b", None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert access.bearer_token(header) == token


def test_the_cache_keeps_allowed_longer_than_refusals_and_never_unavailable() -> None:
    cache = DecisionCache(allowed_ttl_s=60, denied_ttl_s=10)
    cache.store("a", Decision("allowed"), now=0)
    cache.store("f", Decision("forbidden", "no"), now=0)
    cache.store("u", Decision("unauthenticated"), now=0)
    cache.store("x", Decision("unavailable"), now=0)
    assert cache.lookup("x", now=0) is None
    assert cache.lookup("f", now=9.9) == Decision("forbidden", "no")
    assert cache.lookup("f", now=10) is None and cache.lookup("u", now=10) is None
    assert cache.lookup("a", now=59.9) == Decision("allowed")
    assert cache.lookup("a", now=60) is None
    assert len(cache) == 0


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cache = DecisionCache(max_entries=3)
    for key in "abc":
        cache.store(key, Decision("allowed"), now=0)
    assert cache.lookup("a", now=1) is not None  # a is now the most recent
    cache.store("d", Decision("allowed"), now=1)
    assert len(cache) == 3
    assert cache.lookup("b", now=1) is None
    assert all(cache.lookup(k, now=1) is not None for k in "acd")


def test_the_cache_key_is_not_the_token() -> None:
    key = access.cache_key("s3cr3t-token", "/metrics")
    assert "s3cr3t" not in key and len(key) == 64
    assert key != access.cache_key("s3cr3t-token", "/monitor/snapshot")


async def test_cached_authorizer_asks_once_per_token_and_path_until_expiry() -> None:
    table, now = Table(), [0.0]
    cached = CachedAuthorizer(table, clock=lambda: now[0])
    for _ in range(3):
        assert (await cached.allowed("good", "/metrics")).allowed
        assert (await cached.allowed("other", "/metrics")).verdict == "forbidden"
    assert (await cached.allowed(None, "/metrics")).verdict == "unauthenticated"
    assert table.asked == {("good", "/metrics"): 1, ("other", "/metrics"): 1}
    now[0] = 10.0  # the refusal expired, the allowance did not
    await cached.allowed("good", "/metrics")
    await cached.allowed("other", "/metrics")
    assert table.asked == {("good", "/metrics"): 1, ("other", "/metrics"): 2}
    table.down = True  # unavailable is not remembered: asked again every time
    now[0] = 100.0
    for _ in range(2):
        assert (await cached.allowed("good", "/metrics")).verdict == "unavailable"
    assert table.asked[("good", "/metrics")] == 3

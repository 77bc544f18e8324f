"""kit.backoff: the one retry schedule, and the loops that use it (each keeps its own attempt
count and its own choice of what to retry)."""

from __future__ import annotations

import math
import random
from typing import Any

import anyio
import pytest

from bus.errors import BusError
from bus.settings import BusSettings
from controlplane.k8s.client import KubeSettings
from controlplane.worker import running
from kit import backoff
from kit.backoff import Backoff
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio


def test_the_schedule_starts_at_first_multiplies_and_stops_at_the_cap() -> None:
    schedule = Backoff(0.2, 5.0)
    assert [schedule.delay_s(n) for n in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert [Backoff(1, 100, factor=3).delay_s(n) for n in range(6)] == [1, 3, 9, 27, 81, 100]
    assert Backoff(1, 1, factor=1).delay_s(50) == 1
    assert schedule.delay_s(-3) == 0.2  # a negative attempt is the first


@pytest.mark.parametrize("attempt", [1023, 1100, 10**6, 10**18])
def test_any_attempt_number_gets_the_cap_never_an_overflow(attempt: int) -> None:
    """``2.0 * 2**1100`` raises OverflowError: a loop failing for long must not crash on it."""
    assert Backoff(2.0, 5.0).delay_s(attempt) == 5.0
    assert Backoff(0.0, 5.0).delay_s(attempt) == 0.0


def test_a_peer_s_retry_after_lengthens_the_wait_up_to_the_cap() -> None:
    schedule = Backoff(0.2, 5.0)
    assert schedule.delay_s(0, at_least_s=2.0) == 2.0
    assert schedule.delay_s(0, at_least_s=60.0) == 5.0
    assert schedule.delay_s(5, at_least_s=0.1) == 5.0
    assert schedule.delay_s(1, at_least_s=None) == 0.4


@pytest.mark.parametrize(
    ("first", "cap", "factor"),
    [(-1, 5, 2), (6, 5, 2), (1, math.inf, 2), (math.nan, 5, 2), (1, 5, 0.5), (1, 5, math.nan)],
)
def test_a_schedule_that_would_shrink_or_never_end_is_refused(
    first: float, cap: float, factor: float
) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(first, cap, factor)


async def test_wait_sleeps_the_scheduled_delay() -> None:
    with anyio.move_on_after(5):
        assert await Backoff(0.01, 0.02).wait(3) == 0.02
        assert await Backoff(0.0, 1.0).wait(0, at_least_s=0.01) == 0.01


def test_the_kube_client_retries_on_the_shared_schedule() -> None:
    settings = KubeSettings.for_tests(backoff_s=0.2, max_backoff_s=5.0)
    assert [settings.backoff.delay_s(n) for n in range(6)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    assert settings.backoff.delay_s(0, at_least_s=30) == 5.0  # Retry-After, capped
    assert KubeSettings.for_tests(backoff_s=9.0, max_backoff_s=5.0).backoff.delay_s(0) == 5.0


async def test_re_ensuring_the_bus_outlives_a_thousand_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JetStream unready for hours after a reconnect: the worker keeps retrying every 5 s
    (the loop's 1024th wait overflowed the float power and crashed the worker before)."""
    failures = 1100
    slept: list[float] = []

    async def ensure_streams(conn: Any, settings: BusSettings) -> None:
        if len(slept) < failures:
            raise BusError("JetStream not ready")

    async def open_bucket(conn: Any, bucket: str, *, replicas: int) -> None:
        return None

    async def sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(running.state, "ensure_streams", ensure_streams)
    monkeypatch.setattr(running.kv, "open_bucket", open_bucket)
    monkeypatch.setattr(anyio, "sleep", sleep)
    monkeypatch.setattr(running.log, "warning", lambda *a, **k: None)  # 1,100 lines otherwise
    settings = running.WorkerSettings(
        bus=BusSettings(reconnect_wait_s=2.0),
        kube=None,
        https=HttpsSettings(bind_address="127.0.0.1", port=0),
        concurrency=1,
    )
    assert await running._ensure_bus(object(), settings) is True  # type: ignore[arg-type]
    assert len(slept) == failures
    assert slept[:3] == [2.0, 4.0, 5.0] and set(slept[2:]) == {5.0}


async def test_the_kube_client_waits_the_schedule_and_honours_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real HTTP server answers 429 (``Retry-After: 3``), 503, 503, then 200: the client's
    waits are the schedule's (0.1, 0.2), lengthened to the peer's 3 s but capped at 1 s."""
    from aiohttp import web

    from controlplane.k8s import client

    answers = [(429, {"Retry-After": "3"}), (503, {}), (503, {})]

    async def node(_: web.Request) -> web.Response:
        if answers:
            status, headers = answers.pop(0)
            return web.json_response({"kind": "Status", "message": "busy"}, status=status,
                                     headers=headers)  # fmt: skip
        return web.json_response({"kind": "Node", "metadata": {"name": "n"}})

    app = web.Application()
    app.router.add_get("/api/v1/nodes/n", node)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    slept: list[float] = []
    real_sleep = anyio.sleep

    async def sleep(delay: float) -> None:
        slept.append(delay)
        await real_sleep(0)

    try:
        settings = KubeSettings.for_tests(
            f"http://127.0.0.1:{port}", backoff_s=0.1, max_backoff_s=1.0
        )
        async with client.open_client(settings) as api:
            monkeypatch.setattr(anyio, "sleep", sleep)
            got = await api.request("GET", "/api/v1/nodes/n")
            monkeypatch.undo()
    finally:
        await runner.cleanup()
    assert got["metadata"]["name"] == "n"
    assert slept == [1.0, 0.2, 0.4]


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

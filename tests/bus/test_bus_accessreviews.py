"""Access reviews over a real nats-server: agents ask, one worker replica answers, failures close."""

from __future__ import annotations

from collections import Counter

import anyio
import msgspec
import pytest

from bus import accessreviews, connection
from bus.settings import BusSettings
from kit.access import Decision

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


class Table:
    """An authorizer deciding from a table of ``(token, path)``; counts what it was asked."""

    def __init__(self, name: str = "", *, fail: bool = False) -> None:
        self.name = name
        self.fail = fail
        self.asked: Counter[tuple[str | None, str]] = Counter()

    async def allowed(self, token: str | None, path: str) -> Decision:
        self.asked[(token, path)] += 1
        if self.fail:
            raise RuntimeError("reviewer bug")
        if token == "good":
            return Decision("allowed")
        if token == "other":
            return Decision("forbidden", f"other may not get {path} {self.name}".strip())
        return Decision("unauthenticated", "invalid bearer token")


def test_answers_are_read_strictly() -> None:
    assert accessreviews.decision_from(b'{"v":1,"verdict":"allowed"}') == Decision("allowed")
    assert accessreviews.decision_from(b'{"v":1,"verdict":"forbidden","reason":"r"}') == Decision(
        "forbidden", "r"
    )
    for odd in (b"", b"not json", b'{"v":2,"verdict":"allowed"}', b'{"v":1,"verdict":"maybe"}'):
        assert accessreviews.decision_from(odd).verdict == "unavailable", odd


async def test_the_agent_asks_and_the_worker_answers(settings: BusSettings) -> None:
    table = Table()
    agent = accessreviews.BusReviewer("gpu-1")
    async with (
        connection.connect(settings, retry=False) as worker_conn,
        accessreviews.serve_reviews(worker_conn, table),
        connection.connect(settings, retry=False) as agent_conn,
        agent.attach(agent_conn),
    ):
        assert await agent.allowed("good", "/metrics") == Decision("allowed")
        assert await agent.allowed("other", "/monitor/snapshot") == Decision(
            "forbidden", "other may not get /monitor/snapshot"
        )
        assert (await agent.allowed("bad", "/metrics")).verdict == "unauthenticated"
        assert (await agent.allowed(None, "/metrics")).verdict == "unauthenticated"
    # No token is refused on the agent: the worker was never asked about it.
    assert set(table.asked) == {("good", "/metrics"), ("other", "/monitor/snapshot"),
                                ("bad", "/metrics")}  # fmt: skip


async def test_the_agent_fails_closed_without_a_worker(settings: BusSettings) -> None:
    agent = accessreviews.BusReviewer("gpu-1", timeout_s=0.5)
    unattached = await agent.allowed("good", "/metrics")
    assert unattached.verdict == "unavailable" and "no bus connection" in unattached.reason
    async with connection.connect(settings, retry=False) as conn, agent.attach(conn):
        with anyio.fail_after(0.4):  # the server says "no responders" at once: no timeout wait
            nobody = await agent.allowed("good", "/metrics")
        assert nobody.verdict == "unavailable" and "no responder" in nobody.reason
        async with conn.serve_requests(
            accessreviews.SUBJECT, lambda payload, reply: None, queue="q"
        ):
            silent = await agent.allowed("good", "/metrics")  # a responder that never answers
        assert silent.verdict == "unavailable" and "no answer" in silent.reason
    assert (await agent.allowed("good", "/metrics")).verdict == "unavailable"  # detached


async def test_the_worker_survives_bad_requests_and_a_failing_reviewer(
    settings: BusSettings,
) -> None:
    async with (
        connection.connect(settings, retry=False) as conn,
        accessreviews.serve_reviews(conn, Table(fail=True)),
    ):
        for payload in (b"not json", b'{"v":2,"token":"t","path":"/m"}', b"x" * 70_000):
            answer = await conn.request(accessreviews.SUBJECT, payload, timeout_s=2)
            assert accessreviews.decision_from(answer).verdict == "unavailable"
        request = accessreviews.ReviewRequest(token="good", path="/metrics", node="n")
        answer = await conn.request(
            accessreviews.SUBJECT, msgspec.json.encode(request), timeout_s=2
        )
        assert accessreviews.decision_from(answer) == Decision("unavailable", "review failed")


async def test_one_replica_answers_each_request(settings: BusSettings) -> None:
    first, second = Table("first"), Table("second")
    agent = accessreviews.BusReviewer("gpu-1")
    async with (
        connection.connect(settings, retry=False) as a,
        accessreviews.serve_reviews(a, first),
        connection.connect(settings, retry=False) as b,
        accessreviews.serve_reviews(b, second),
        connection.connect(settings, retry=False) as conn,
        agent.attach(conn),
    ):
        for i in range(40):
            assert (await agent.allowed("other", f"/p{i}")).verdict == "forbidden"
    assert first.asked.total() + second.asked.total() == 40
    assert first.asked and second.asked  # the queue group spreads the requests

"""Download progress as ``Normal`` events on the waiting Pods (issue 19).

The pure plan first; then :class:`PodEventer` against the stateful fake API over HTTP (the real
kubernetes_asyncio client); then the whole worker: a models event published on a real
nats-server becomes an Event on the Pod it names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node

from bus import codec, connection, events, subjects
from bus.testing import eventually, nats_server, settings_for
from controlplane.k8s.client import KubeClient, KubeSettings, open_client
from controlplane.reconciling.podevents import (
    DOWNLOADED,
    DOWNLOADING,
    PodEventer,
    Post,
    event_name,
    plan,
)
from controlplane.worker import leading, running
from kit.serving import HttpsSettings

DIGEST = "sha256:" + "ab" * 32
SHORT = "sha256:abababababab"
GIB = 1024**3
EVENTS = "api/v1/events"
A = events.WaitingPod(namespace="team-a", name="llm-0", uid="uid-a")
B = events.WaitingPod(namespace="team-b", name="llm-1", uid="uid-b")


def downloading(done: int, *pods: events.WaitingPod) -> events.ModelState:
    return events.ModelState(
        model=DIGEST, digest=DIGEST, state="downloading", bytes_done=done,
        bytes_total=8 * GIB, waiting_pods=pods or None,
    )  # fmt: skip


READY = events.ModelState(model=DIGEST, digest=DIGEST, state="ready", bytes_total=8 * GIB)
FAILED = events.ModelState(model=DIGEST, digest=DIGEST, state="failed", reason="AccessDenied")


def test_a_pod_starting_to_wait_is_told_at_once_then_at_most_every_period() -> None:
    posts, known = plan("n1", (downloading(GIB, A),), {}, now=100.0, every_s=20.0)
    again, known = plan("n1", (downloading(2 * GIB, A, B),), known, now=110.0, every_s=20.0)
    later, known = plan("n1", (downloading(3 * GIB, A, B),), known, now=121.0, every_s=20.0)
    caught_up, known = plan("n1", (downloading(3 * GIB, A, B),), known, now=200.0, every_s=20.0)
    same, _ = plan("n1", (downloading(3 * GIB, A, B),), known, now=300.0, every_s=20.0)

    assert [(p.pod, p.reason, p.message) for p in posts] == [
        (A, DOWNLOADING, f"Downloading model {SHORT} on node n1: 12% (1.0 GiB of 8.0 GiB)")
    ]
    assert [p.pod for p in again] == [B]  # A was told 10 s ago; B is new
    assert [(p.pod, p.message[-24:]) for p in later] == [(A, "37% (3.0 GiB of 8.0 GiB)")]
    assert [p.pod for p in caught_up] == [B]  # B was last told 2.0 GiB
    assert same == []  # nothing moved: nothing to say


def test_the_pods_that_waited_are_told_when_it_is_ready_and_nothing_when_it_failed() -> None:
    _, known = plan("n1", (downloading(GIB, A, B),), {}, now=0.0, every_s=20.0)

    done, after = plan("n1", (READY,), known, now=1.0, every_s=20.0)
    failed, _ = plan("n1", (FAILED,), known, now=1.0, every_s=20.0)
    gone, _ = plan("n1", (), known, now=1.0, every_s=20.0)

    assert [(p.pod, p.reason) for p in done] == [(A, DOWNLOADED), (B, DOWNLOADED)]
    assert done[0].message == f"Downloaded model {SHORT} (8.0 GiB) on node n1"
    assert after == {}
    assert failed == [] and gone == []


def test_an_old_event_posts_nothing_but_is_remembered() -> None:
    posts, known = plan("n1", (downloading(GIB, A),), {}, now=0.0, every_s=20.0, fresh=False)
    later, _ = plan("n1", (downloading(GIB, A),), known, now=5.0, every_s=20.0)

    assert posts == [] and later == []
    assert set(known[DIGEST]) == {"uid-a"}


def test_event_names_are_stable_per_pod_digest_and_reason() -> None:
    one = Post("n1", DIGEST, A, DOWNLOADING, "x")
    assert event_name(one) == event_name(Post("n2", DIGEST, A, DOWNLOADING, "y"))
    assert event_name(one) != event_name(Post("n1", DIGEST, A, DOWNLOADED, "x"))
    assert event_name(one) != event_name(Post("n1", DIGEST, B, DOWNLOADING, "x"))
    assert event_name(one).startswith("llm-0.")


def _models(ts: datetime, *models: events.ModelState) -> events.ModelsEvent:
    return events.ModelsEvent(node="n1", ts=ts, models=models)


def _place(fake: FakeApi, pod: events.WaitingPod, node_name: str = "n1") -> None:
    """The Pod as the API holds it, scheduled to ``node_name``."""
    meta = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
    fake.put_object("api/v1/pods", {"metadata": meta, "spec": {"nodeName": node_name}})


def _events_of(fake: FakeApi, pod: events.WaitingPod) -> list[dict[str, Any]]:
    return [
        o for (c, ns, _), o in fake.objects.items()
        if c == EVENTS and ns == pod.namespace and o["involvedObject"]["uid"] == pod.uid
    ]  # fmt: skip


def _count(eventer: PodEventer, n: int) -> Callable[[], Any]:
    async def check() -> bool:
        return eventer.posted >= n

    return check


@asynccontextmanager
async def _eventer(clock: list[float]) -> AsyncIterator[tuple[FakeApi, KubeClient, PodEventer]]:
    eventer = PodEventer(every_s=20.0, retry_s=0.01, clock=lambda: clock[0])
    async with (
        fake_api() as (fake, url),
        open_client(KubeSettings.for_tests(url, backoff_s=0.01)) as api,
        anyio.create_task_group() as tg,
    ):
        _place(fake, A)
        _place(fake, B, "n2")
        tg.start_soon(eventer.run, api)
        yield fake, api, eventer
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_progress_is_one_normal_event_updated_then_a_downloaded_event() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    clock = [t0.timestamp()]
    async with _eventer(clock) as (fake, _, eventer):
        fake.fail_next("POST", "/api/v1/namespaces/team-a/events", 500)  # retried
        eventer.note(_models(t0, downloading(GIB, A)))
        await eventually(_count(eventer, 1))
        clock[0] += 30
        eventer.note(_models(t0 + timedelta(seconds=30), downloading(4 * GIB, A)))
        await eventually(_count(eventer, 2))
        (progress,) = _events_of(fake, A)
        clock[0] += 5
        eventer.note(_models(t0 + timedelta(seconds=35), READY))
        await eventually(_count(eventer, 3))
        both = sorted(_events_of(fake, A), key=lambda e: e["reason"])

    assert progress["type"] == "Normal" and progress["reason"] == DOWNLOADING
    assert progress["count"] == 2
    assert progress["message"].endswith("50% (4.0 GiB of 8.0 GiB)")
    assert progress["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "llm-0", "uid": "uid-a",
    }  # fmt: skip
    assert progress["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert progress["lastTimestamp"] == "2026-01-01T00:00:30Z"
    assert [(e["reason"], e["type"]) for e in both] == [
        (DOWNLOADED, "Normal"),
        (DOWNLOADING, "Normal"),
    ]
    assert both[0]["message"] == f"Downloaded model {SHORT} (8.0 GiB) on node n1"


@pytest.mark.anyio
async def test_a_restarted_worker_continues_the_existing_event() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    clock = [t0.timestamp()]
    async with _eventer(clock) as (fake, api, first):
        first.note(_models(t0, downloading(GIB, A)))
        await eventually(_count(first, 1))
        restarted = PodEventer(clock=lambda: clock[0])
        await restarted.write(api, Post("n1", DIGEST, A, DOWNLOADING, "later"))
        (event,) = _events_of(fake, A)

    assert (event["count"], event["message"]) == (2, "later")


@pytest.mark.anyio
async def test_no_event_on_a_pod_of_another_node_or_none_or_another_uid() -> None:
    """An agent's word about Pods goes no further than its own node's."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    clock = [t0.timestamp()]
    ghost = events.WaitingPod(namespace="team-a", name="ghost", uid="uid-g")
    twin = events.WaitingPod(namespace="team-a", name="llm-0", uid="uid-other")
    async with _eventer(clock) as (fake, api, eventer):
        for pod in (B, ghost, twin):  # B runs on n2; ghost does not exist; twin: A's name
            await eventer.write(api, Post("n1", DIGEST, pod, DOWNLOADING, "lies"))
        reads = fake.requests["GET"]
        for pod in (B, ghost, twin):  # the same claims again: refused without asking the API
            await eventer.write(api, Post("n1", DIGEST, pod, DOWNLOADING, "lies again"))
        assert fake.requests["GET"] == reads
        eventer.note(_models(t0, downloading(GIB, A)))
        await eventually(_count(eventer, 1))
        posted = [o for (c, _, _), o in fake.objects.items() if c == EVENTS]

    assert [e["involvedObject"]["name"] for e in posted] == ["llm-0"]
    assert posted[0]["involvedObject"]["uid"] == "uid-a"


@pytest.mark.anyio
async def test_the_worker_posts_events_on_the_pods_a_models_event_names(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
    ):
        bus = settings_for(server)
        fake.put_object("api/v1/nodes", node("n1"))
        _place(fake, A)
        _place(fake, B)
        settings = running.WorkerSettings(
            concurrency=16,
            bus=bus,
            kube=KubeSettings.for_tests(url, backoff_s=0.01),
            https=HttpsSettings(bind_address="127.0.0.1", port=0, auth="none"),
            leader=leading.LeaderSettings(
                name="w", namespace="ns", lease_s=1.0, renew_timeout_s=0.6
            ),
            identity="w1",
            resync_s=0.3,
        )
        await tg.start(running.run, settings)
        async with connection.connect(bus, name="test") as conn:
            for e in (_models(now, downloading(GIB, A, B)), _models(now, READY)):
                await conn.publish(subjects.subject("n1", "models"), codec.encode(e))
                await conn.flush()

                async def told(want: int = 2 if e.models[0].state == "ready" else 1) -> bool:
                    return all(len(_events_of(fake, p)) == want for p in (A, B))

                await eventually(told)
        reasons = {p.name: sorted(e["reason"] for e in _events_of(fake, p)) for p in (A, B)}
        tg.cancel_scope.cancel()

    assert reasons == {"llm-0": [DOWNLOADED, DOWNLOADING], "llm-1": [DOWNLOADED, DOWNLOADING]}

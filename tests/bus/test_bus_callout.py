"""Per-node identity enforced by a real nats-server through the auth callout (bus.callout).

Every client but the worker connects with a token; the callout (served on the worker's own
connection, as the worker serves it) maps it to an identity and answers a user JWT carrying
:func:`bus.identity.permissions_for`. What is checked is what the server then refuses: node A
forging node B, administering a stream, reading replies meant for others; and that the rights
each part needs still work.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import msgspec
import pytest

from bus import callout, codec, connection, errors, events, kv, publishing, state, subjects, testing
from bus.identity import Identity
from bus.metrics import BusMetrics
from bus.settings import BusSettings

pytestmark = pytest.mark.anyio

A = Identity(role="device-manager", node="gpu-a.example")
B = Identity(role="device-manager", node="gpu-b.example")
MM_A = Identity(role="model-manager", node="gpu-a.example")
DASHBOARD = Identity(role="dashboard")
TOKENS = {
    "token-a": A,
    "token-b": B,
    "token-mm-a": MM_A,
    "token-dash": DASHBOARD,
}


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[testing.CalloutBus]:
    async with testing.callout_server(tmp_path, callout.token_table(TOKENS)) as b:
        async with connection.connect(b.worker, retry=False) as conn:
            await state.ensure_streams(conn, b.worker)  # the worker's job, before agents publish
        yield b


def _as(bus: testing.CalloutBus, token: str) -> BusSettings:
    return bus.settings_as(TOKENS[token], token)


def _event(ident: Identity, kind: str, *, node: str | None = None) -> events.Event:
    node = node or ident.node
    assert node is not None
    return next(e for e in testing.example_events(node) if events.kind_of(e) == kind)


async def _publish(settings: BusSettings, evs: list[events.Event]) -> None:
    async with (
        connection.connect(settings, retry=False) as conn,
        publishing.publisher(
            conn, settings=settings, metrics=BusMetrics(), ensure_streams=False
        ) as pub,
    ):
        for e in evs:
            pub.publish(e)
        with anyio.fail_after(10):
            await pub.wait_sent()


async def _retained(settings: BusSettings) -> set[tuple[str, str]]:
    async with connection.connect(settings, retry=False) as conn:
        return {subjects.parse(s) for s, _ in await state.snapshot(conn, settings)}


async def _answer(conn: connection.Connection, subject: str, body: bytes) -> bytes | None:
    """A raw request: the answer, or None when none came within a second."""
    inbox = conn.new_inbox()
    got: list[bytes] = []
    answered = anyio.Event()

    def on_answer(_subject: str, data: bytes) -> None:
        got.append(data)
        answered.set()

    async with conn.subscribe(inbox, on_answer):
        await conn.publish(subject, body, reply=inbox)
        with anyio.move_on_after(1.0):
            await answered.wait()
    return got[0] if got else None


async def test_a_node_publishes_its_own_events_and_the_worker_receives_them(
    bus: testing.CalloutBus,
) -> None:
    kinds = ["devices", "samples", "health", "allocations", "agent"]
    live: list[str] = []
    async with (
        connection.connect(bus.worker, retry=False) as worker,
        worker.subscribe(subjects.ALL, lambda s, _d: live.append(s)),
    ):
        await worker.flush()
        await _publish(_as(bus, "token-a"), [_event(A, k) for k in kinds])
        await testing.eventually(lambda: _true(len(live) == len(kinds)))
    assert {subjects.parse(s) for s in live} == {("gpu-a.example", k) for k in kinds}
    assert await _retained(bus.worker) == {("gpu-a.example", k) for k in kinds}


async def _true(value: bool) -> bool:
    return value


async def test_node_a_cannot_publish_on_node_b_subjects(
    bus: testing.CalloutBus, caplog: pytest.LogCaptureFixture
) -> None:
    forged = _event(B, "health")  # node B's event, as node A's credential would send it
    async with connection.connect(_as(bus, "token-a"), retry=False) as conn:
        with pytest.raises(errors.PublishFailed):
            await conn.publish_acked(
                subjects.subject("gpu-b.example", "health"), codec.encode(forged)
            )
        # Its own kinds only, even on its own node: models is the model agent's.
        with pytest.raises(errors.PublishFailed):
            models = _event(A, "models")
            await conn.publish_acked(
                subjects.subject("gpu-a.example", "models"), codec.encode(models)
            )
    assert 'permissions violation for publish to "gpustack.v1.node.gpu-b%2eexample.health"' in (
        caplog.text.lower()
    )
    assert await _retained(bus.worker) == set()


async def test_node_a_cannot_update_or_delete_a_stream(bus: testing.CalloutBus) -> None:
    update = json.dumps(
        {"name": state.STATE_STREAM, "subjects": ["gpustack.v1.node.*.devices"], "max_msgs": 1}
    ).encode()
    async with connection.connect(_as(bus, "token-a"), retry=False) as conn:
        for verb in ("STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE", "STREAM.CREATE"):
            subject = f"$JS.API.{verb}.{state.STATE_STREAM}"
            assert await _answer(conn, subject, update) is None, verb
        with pytest.raises(errors.StateUnavailable):
            await state.ensure_streams(conn, _as(bus, "token-a"))
    # Nothing changed: the stream keeps its configured history per subject, for every subject.
    await _publish(_as(bus, "token-a"), [_event(A, "devices"), _event(A, "agent")])
    assert await _retained(bus.worker) == {("gpu-a.example", "devices"), ("gpu-a.example", "agent")}
    # The same request from the worker is answered: the refusal is the permission, not its form.
    async with connection.connect(bus.worker, retry=False) as worker:
        info = await _answer(worker, f"$JS.API.STREAM.INFO.{state.STATE_STREAM}", b"")
    per_subject = BusSettings().state_per_subject
    assert info is not None and f'"max_msgs_per_subject":{per_subject},'.encode() in info


async def test_node_a_cannot_read_another_nodes_or_the_workers_replies(
    bus: testing.CalloutBus, caplog: pytest.LogCaptureFixture
) -> None:
    stolen: list[str] = []
    async with connection.connect(_as(bus, "token-a"), retry=False) as spy:
        for prefix in ("_INBOX.device-manager.gpu-b%2Eexample.>", "_INBOX.worker.>", "_INBOX.>"):
            async with spy.subscribe(prefix, lambda s, _d: stolen.append(s)):
                await spy.flush()
                await _publish(_as(bus, "token-b"), [_event(B, "devices")])
                async with connection.connect(bus.worker, retry=False) as worker:
                    await state.snapshot(worker, bus.worker)
        await anyio.sleep(0.2)
    assert stolen == []
    assert 'permissions violation for subscription to "_inbox.worker.>"' in caplog.text.lower()


async def test_a_node_must_use_its_own_inbox_prefix(bus: testing.CalloutBus) -> None:
    wrong = msgspec.structs.replace(_as(bus, "token-a"), inbox_prefix="_INBOX")
    async with connection.connect(wrong, retry=False) as conn:
        with pytest.raises(errors.PublishFailed):
            await conn.publish_acked(subjects.subject("gpu-a.example", "devices"), b"{}")


async def test_a_dashboard_reads_live_and_retained_state_but_publishes_nothing(
    bus: testing.CalloutBus,
) -> None:
    await _publish(_as(bus, "token-a"), [_event(A, "devices")])
    dash = _as(bus, "token-dash")
    assert await _retained(dash) == {("gpu-a.example", "devices")}
    live: list[str] = []
    async with connection.connect(dash, retry=False) as conn:
        async with conn.subscribe(subjects.ALL, lambda s, _d: live.append(s)):
            await conn.flush()
            await _publish(_as(bus, "token-b"), [_event(B, "agent")])
            await testing.eventually(lambda: _true(bool(live)))
        with pytest.raises(errors.PublishFailed):
            await conn.publish_acked(subjects.subject("gpu-a.example", "devices"), b"{}")
        assert await _answer(conn, f"$JS.API.STREAM.DELETE.{state.STATE_STREAM}", b"") is None
    assert live == [subjects.subject("gpu-b.example", "agent")]


async def test_the_model_agent_reads_its_own_keys_only_and_writes_none(
    bus: testing.CalloutBus,
) -> None:
    async with connection.connect(bus.worker, retry=False) as worker:
        agents = await kv.open_bucket(worker, kv.AGENTS_BUCKET)
        await agents.put(kv.nms_key("gpu-a.example"), b'{"mine": true}')
        await agents.put(kv.nms_key("gpu-b.example"), b'{"theirs": true}')
        await agents.put(kv.artifact_key("ns", "qwen"), b'{"artifact": true}')
    async with connection.connect(_as(bus, "token-mm-a"), retry=False) as conn:
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET, create=False)
        got = await bucket.get(kv.nms_key("gpu-a.example"))
        assert got is not None and got[0] == b'{"mine": true}'
        assert await bucket.last_values("artifacts.>") == [
            (kv.artifact_key("ns", "qwen"), b'{"artifact": true}')
        ]
        with pytest.raises(errors.StateUnavailable):
            await bucket.get(kv.nms_key("gpu-b.example"))
        with pytest.raises(errors.StateUnavailable):
            await bucket.last_values(">")  # every key, node B's included
        with pytest.raises(errors.StateUnavailable):
            await bucket.put(kv.nms_key("gpu-a.example"), b'{"forged": true}')
        with pytest.raises(errors.StateUnavailable):
            await kv.open_bucket(conn, "GPUSTACK_V1_OTHER")  # may not create buckets


async def test_the_device_agent_reads_its_own_pending_containers_only(
    bus: testing.CalloutBus,
) -> None:
    async with connection.connect(bus.worker, retry=False) as worker:
        agents = await kv.open_bucket(worker, kv.AGENTS_BUCKET)
        await agents.put(kv.pending_key("gpu-a.example"), b'{"mine": true}')
        await agents.put(kv.pending_key("gpu-b.example"), b'{"theirs": true}')
    async with connection.connect(_as(bus, "token-a"), retry=False) as conn:
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET, create=False)
        got = await bucket.get(kv.pending_key("gpu-a.example"))
        assert got is not None and got[0] == b'{"mine": true}'
        with pytest.raises(errors.StateUnavailable):
            await bucket.get(kv.pending_key("gpu-b.example"))
        with pytest.raises(errors.StateUnavailable):
            await bucket.get(kv.nms_key("gpu-a.example"))  # the model agent's key
        with pytest.raises(errors.StateUnavailable):
            await bucket.last_values(">")
        with pytest.raises(errors.StateUnavailable):
            await bucket.put(kv.pending_key("gpu-a.example"), b'{"forged": true}')


async def test_the_worker_turns_on_direct_gets_in_a_bucket_of_an_older_version(
    bus: testing.CalloutBus,
) -> None:
    async with connection.connect(bus.worker, retry=False) as worker:
        # As an earlier version created it: no direct gets, so a get names no key in its subject.
        await worker._js.create_key_value(bucket=kv.AGENTS_BUCKET, history=1)
        await (await kv.open_bucket(worker, kv.AGENTS_BUCKET)).put(
            kv.nms_key("gpu-a.example"), b"1"
        )
    async with connection.connect(_as(bus, "token-mm-a"), retry=False) as conn:
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET, create=False)
        got = await bucket.get(kv.nms_key("gpu-a.example"))
    assert got is not None and got[0] == b"1"


async def test_the_device_agent_reads_its_own_allocation_history_only(
    bus: testing.CalloutBus,
) -> None:
    await _publish(_as(bus, "token-a"), [_event(A, "allocations")])
    await _publish(_as(bus, "token-b"), [_event(B, "allocations")])
    settings = _as(bus, "token-a")
    async with connection.connect(settings, retry=False) as conn:
        mine = await state.history(conn, settings, node="gpu-a.example", kind="allocations")
        assert len(mine) == 1
        with pytest.raises(errors.StateUnavailable):
            await state.history(conn, settings, node="gpu-b.example", kind="allocations")


@pytest.mark.parametrize("token", [None, "", "token-unknown", "token-a-but-longer"])
async def test_an_unknown_or_missing_token_is_refused(
    bus: testing.CalloutBus, token: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    settings = msgspec.structs.replace(testing.settings_for(bus.server), token=token or None)
    with caplog.at_level(logging.WARNING, logger="bus.callout"), pytest.raises(errors.NotConnected):
        async with connection.connect(settings, retry=False):
            pass
    assert "refused bus connection" in caplog.text and "unknown token" in caplog.text
    assert "Authorization Violation" in caplog.text


# nats-py leaves the transport of a refused reconnect attempt to the garbage collector.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_node_reconnects_once_the_callout_answers_again(tmp_path: Path) -> None:
    """A server restart while the worker refuses (or is away): the agent's reconnects are
    refused, and it gets back on its own once the callout answers, as the same identity."""
    answering = True
    table = callout.token_table(TOKENS)

    async def verify(credentials: callout.Credentials) -> callout.Grant:
        if not answering:
            raise callout.Refused("the worker is restarting")
        return await table(credentials)

    async with (
        testing.callout_server(tmp_path, verify) as bus,
        connection.connect(bus.worker, retry=False) as worker,
        connection.connect(_as(bus, "token-a"), retry=False) as conn,
    ):
        await state.ensure_streams(worker, bus.worker)
        answering = False
        await bus.server.restart()
        await anyio.sleep(1.0)  # reconnects are attempted, and refused
        assert not conn.is_connected
        answering = True
        await testing.eventually(lambda: _true(conn.is_connected))

        async def stored() -> bool:  # JetStream may still be recovering the streams
            try:
                await conn.publish_acked(
                    subjects.subject("gpu-a.example", "agent"), codec.encode(_event(A, "agent"))
                )
            except errors.PublishFailed:
                return False
            return True

        await testing.eventually(stored)
    gc.collect()  # the leaked transports warn now, under this test's filter, not in a later test


# nats-py's WebSocket transport still hands aiohttp a float timeout, and leaves the transport
# of a refused connection to the garbage collector.
@pytest.mark.filterwarnings("ignore:parameter 'timeout' of type 'float':DeprecationWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_only_a_dashboard_connects_over_websocket(tmp_path: Path) -> None:
    async with testing.callout_server(tmp_path, callout.token_table(TOKENS), websocket=True) as b:
        async with connection.connect(b.worker, retry=False) as worker:
            await state.ensure_streams(worker, b.worker)
        ws = f"ws://127.0.0.1:{b.server.websocket_port}"
        dashboard = msgspec.structs.replace(_as(b, "token-dash"), url=ws)
        assert await _retained(dashboard) == set()  # connected, and reads
        agent = msgspec.structs.replace(_as(b, "token-a"), url=ws)
        with pytest.raises(errors.NotConnected):
            async with connection.connect(agent, retry=False):
                pass
    gc.collect()  # see test_a_node_reconnects_once_the_callout_answers_again

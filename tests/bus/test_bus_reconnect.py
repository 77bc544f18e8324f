"""A connection never gives up: the retry decision, the presence it reports, and a real
server that refuses a client through its auth callout (the callout responder stalled).

With the callout stalled, the server ends each connection attempt with "Authorization
Violation" once its callout timeout (5 s) passes. nats-py's own reconnect loop closed the
client for good on that answer (issue 31); the connection now replaces the client, subscribes
again and delivers what waited in the outbox.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import anyio
import msgspec
import pytest

from bus import callout, codec, connection, dialing, identity, publishing, state, testing
from bus.callout import Credentials, Grant
from bus.metrics import BusMetrics
from bus.presence import Presence
from bus.settings import BusSettings

# The waits are generous; the subject does I/O of its own (tests/conftest.py).
pytestmark = [pytest.mark.anyio, pytest.mark.every_loop, pytest.mark.timeout(150)]

NODE = "n1.example"


def test_a_retrying_dialer_tries_again_for_ever_with_jittered_waits() -> None:
    settings = BusSettings(reconnect_wait_s=2.0)
    rng = random.Random(1)
    waits = [
        dialing.next_attempt(n, retry=True, settings=settings, rng=rng) for n in range(1, 10_000)
    ]
    assert all(w is not None for w in waits)
    assert all(1.0 <= w <= dialing.MAX_BACKOFF_S for w in waits if w is not None)
    assert waits[0] is not None and waits[0] <= 2.0  # the first retry comes soon
    assert len({round(w, 6) for w in waits if w is not None}) > 9_000  # spread, not lock-step


def test_a_dialer_that_may_not_retry_gives_up_at_once() -> None:
    assert dialing.next_attempt(1, retry=False, settings=BusSettings()) is None


def test_presence_counts_from_the_first_loss_until_connected_again() -> None:
    p = Presence(since=100.0)  # a process that started at 100 and has no connection yet
    assert not p.online and p.offline_for(130.0) == 30.0
    assert p.alive(130.0, 30.0) and not p.alive(130.5, 30.0)
    p.connected()
    assert p.online and p.alive(10_000.0, 30.0)
    p.lost(200.0)
    p.lost(250.0)  # still off: the outage began at 200
    assert p.offline_for(260.0) == 60.0 and not p.alive(260.0, 59.0)
    p.connected()
    assert p.offline_for(260.0) == 0.0


class _Stallable:
    def __init__(self, verify: callout.Verifier) -> None:
        self._verify = verify
        self.gate = anyio.Event()
        self.gate.set()
        self.stalled = 0

    async def __call__(self, credentials: Credentials) -> Grant:
        if not self.gate.is_set():
            self.stalled += 1
            await self.gate.wait()
        return await self._verify(credentials)


async def _true(value: bool) -> bool:
    return value


async def test_a_client_the_callout_refused_is_replaced_and_its_outbox_delivered(
    tmp_path: Path,
) -> None:
    """The server restarts while the callout responder answers nothing: the agent's attempts
    end in "Authorization Violation" until it answers again. Then the agent is back, and what
    it queued meanwhile is stored: a state event leaves the outbox only once its
    acknowledgement arrives on the publisher's reply subscription, so that subscription was
    made again on the new client too."""
    ident = identity.Identity(role="device-manager", node=NODE)
    verify = _Stallable(callout.token_table({"agent-token": ident}))
    async with testing.callout_server(tmp_path, verify) as bus:
        # Production's connect timeout (5 s), which meets the server's callout timeout.
        agent = msgspec.structs.replace(bus.settings_as(ident, "agent-token"), connect_timeout_s=5)
        metrics = BusMetrics()
        async with (
            connection.connect(bus.worker, retry=False) as admin,
            connection.connect(agent, name="agent") as conn,
            publishing.publisher(
                conn, settings=agent, metrics=metrics, ensure_streams=False
            ) as pub,
        ):
            await state.ensure_streams(admin, bus.worker)  # the worker's job
            verify.gate = anyio.Event()  # the responder stalls from now on
            await bus.server.restart()
            # A second stalled request: the agent was refused, and dialed again.
            await testing.eventually(lambda: _true(verify.stalled >= 2), timeout_s=30)
            devices = testing.example_events(NODE)[0]
            pub.publish(devices)  # queued while the agent is off the bus
            verify.gate.set()

            # connected and counted: the count follows the connection by a loop turn or two
            # (a CI run under load read it in between)
            back = lambda: _true(conn.is_connected and conn.reconnects >= 1)
            await testing.eventually(back, timeout_s=60)
            assert conn.presence.alive(anyio.current_time(), agent.max_offline_s)
            await testing.eventually(lambda: _true(pub.pending == 0), timeout_s=30)
            await testing.eventually(lambda: _true(admin.is_connected), timeout_s=30)
            (stored,) = await state.snapshot(admin, bus.worker, node=NODE, kind="devices")
            assert stored[1] == codec.encode(devices)


async def test_leaving_while_the_client_is_being_replaced_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    """The server is gone and the keeper is dialing: leaving the connection cancels it, closes
    whichever client it holds, and no task of any client outlives the block (the leaked-task
    check of every test); a subscription opened while off the bus is given up quietly."""
    async with testing.nats_server(tmp_path) as server:
        settings = testing.settings_for(server)
        with anyio.fail_after(20):
            async with connection.connect(settings, retry=False) as conn:
                await server.stop()
                await testing.eventually(lambda: _true(not conn.presence.online))
                async with conn.subscribe("gpustack.v1.node.>", lambda s, d: None):
                    await anyio.sleep(0.3)  # a few dialing rounds, all refused
                assert not conn.is_connected


async def test_a_flush_that_timed_out_does_not_end_the_connection(tmp_path: Path) -> None:
    """nats-py's flush cancels its PONG future on timeout, then set the late PONG's result on
    it anyway: the reader raised InvalidStateError and the connection ended (a replacement
    each time a loaded server answered a flush late)."""
    async with testing.nats_server(tmp_path) as server:
        settings = testing.settings_for(server)
        async with connection.connect(settings, retry=False) as conn:
            client = conn._nc  # the adapter's client: this is nats-py's own flush, timed out
            for _ in range(20):
                with contextlib.suppress(Exception):
                    await client.flush(timeout=1e-9)
            await conn.flush()  # the late PONGs have all come back by now
            assert conn.is_connected and conn._nc is client and conn.reconnects == 0

"""The server dies under a running publisher: nothing of the latest state may be lost."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from bus import (
    codec,
    connection,
    dialing,
    events,
    jetstream,
    publishing,
    state,
    subjects,
    subscribing,
    testing,
)
from bus.embedded import ServerProcess
from bus.errors import NotConnected, StateUnavailable
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from kit import tls

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

NODES = [f"gpu-{i}.example.com" for i in range(10)]


def _latest_by_subject(published: list[events.Event]) -> dict[str, events.Event]:
    latest: dict[str, events.Event] = {}
    for ev in published:
        latest[subjects.subject(ev.node, events.kind_of(ev))] = ev
    return latest


async def _retained(conn: connection.Connection, settings: BusSettings) -> dict[str, events.Event]:
    out = {}
    for subj, data in await state.snapshot(conn, settings):
        node, kind = subjects.parse(subj)
        out[subj] = codec.decode(data, kind=kind, node=node, max_bytes=1 << 20)
    return out


async def _snapshot_once_answering(
    conn: connection.Connection, settings: BusSettings, *, timeout_s: float = 20.0
) -> list[jetstream.RawMessage]:
    """The agent state, retried while the cluster has no stream leader yet.

    After a member dies, the JetStream meta and stream groups elect new leaders; until they
    have, API requests time out (``StateUnavailable``). That is the documented behaviour of
    ``snapshot`` (callers retry), and on a loaded machine the election outlasts one request.
    """
    with anyio.fail_after(timeout_s):
        while True:
            try:
                return await state.snapshot(conn, settings, kind="agent")
            except StateUnavailable:
                await anyio.sleep(0.1)


async def test_publisher_resumes_after_server_restart_and_loses_no_state(
    server: ServerProcess, settings: BusSettings, metrics: BusMetrics
) -> None:
    published: list[events.Event] = []
    async with (
        connection.connect(settings) as conn,
        publishing.publisher(conn, settings=settings, metrics=metrics) as pub,
    ):

        async def publish_round(seq: int) -> None:
            for node in NODES:
                for ev in testing.example_events(node, seq=seq):
                    if not isinstance(ev, events.SamplesEvent):
                        published.append(ev)
                    pub.publish(ev)
            await anyio.sleep(0.01)

        for seq in range(5):
            await publish_round(seq)
        server.kill()  # a crash: no clean shutdown, in-flight messages are lost
        for seq in range(5, 15):  # keeps publishing while the server is gone
            await publish_round(seq)
        assert pub.pending > 0
        await server.restart()
        for seq in range(15, 18):
            await publish_round(seq)
        with anyio.fail_after(15):
            await pub.wait_sent()
        assert conn.is_connected
        retained = await _retained(conn, settings)
    expected = _latest_by_subject(published)
    assert {s: retained.get(s) for s in expected} == expected


async def test_outbox_is_bounded_while_disconnected(
    server: ServerProcess, metrics: BusMetrics, tmp_path: Path
) -> None:
    settings = testing.settings_for(server, outbox_size=10)
    async with (
        connection.connect(settings) as conn,
        publishing.publisher(conn, settings=settings, metrics=metrics) as pub,
    ):
        await server.stop()
        for seq in range(200):
            for ev in testing.example_events("n1", seq=seq):
                pub.publish(ev)
        # 10 samples + devices, models, agent, one health (one accelerator), 200 allocations
        assert pub.pending == 10 + 4 + 200
        assert (
            metrics.registry.get_sample_value(
                "gpustack_bus_outbox_dropped_events_total", {"kind": "samples"}
            )
            == 190
        )
        await server.start()
        with anyio.fail_after(15):
            await pub.wait_sent()


async def test_cluster_client_fails_over_when_its_server_dies(tmp_path: Path) -> None:
    metrics = BusMetrics()
    async with testing.nats_cluster(tmp_path, size=3) as servers:
        settings = testing.settings_for(servers, state_replicas=3)
        async with (
            connection.connect(settings) as pub_conn,
            connection.connect(settings) as sub_conn,
            subscribing.subscribe(
                sub_conn, settings=settings, metrics=metrics, kind="agent"
            ) as sub,
            publishing.publisher(pub_conn, settings=settings, metrics=metrics) as pub,
        ):
            pub.publish(testing.example_events("n1", seq=0)[5])
            [first] = await testing.collect(sub, 1)
            assert isinstance(first, events.AgentEvent)
            victim_url = pub_conn.connected_url
            [victim] = [s for s in servers if s.url == victim_url]
            victim.kill()
            seq = 1
            with anyio.fail_after(20):
                while True:  # keep publishing until one published after the kill arrives
                    pub.publish(testing.example_events("n1", seq=seq)[5])
                    with anyio.move_on_after(0.3):
                        ev = await anext(sub)
                        assert isinstance(ev, events.AgentEvent)
                        if ev.version != "0.1.0":
                            break
                    seq += 1
            assert pub_conn.connected_url not in (None, victim_url)
            with anyio.fail_after(15):
                await pub.wait_sent()
            retained = await _snapshot_once_answering(pub_conn, settings)
            assert len(retained) == 1
            assert msgspec.json.decode(retained[0][1])["version"] == f"0.1.{seq}"


async def test_a_client_whose_tls_file_vanished_fails_to_connect_in_one_error(
    tmp_path: Path,
) -> None:
    """The TLS context is built before the client ever connects; closing that client must not
    trip nats-py's "connect must be called first" assertion (it did: a traceback, not an error).
    """
    ca = tmp_path / "ca.pem"
    ca.write_bytes(tls.self_signed_certificate("bus")[0])
    settings = BusSettings(url="nats://127.0.0.1:1", tls_ca_file=str(ca), connect_timeout_s=1)
    ca.unlink()  # removed after the process checked its flags

    with pytest.raises(NotConnected, match="FileNotFoundError"):
        await dialing.open_client(settings, "t", retry=False, closed=lambda: None)

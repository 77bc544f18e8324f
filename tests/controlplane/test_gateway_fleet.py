"""The gateway against real peers: two member buses linked to its bus as NATS leaf nodes.

Member ``east`` answers on the gateway's own server, member ``west`` on a second server whose
leaf-node remote points at the first (as docs/gateway.md tells users to link clusters). The
gateway serves on a unix socket; an aiohttp client reads the list and a watch through it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import msgspec
import pytest

from bus import codec, connection, embedded, events, identity, subjects, testing
from bus.devices import DeviceGroup
from bus.fleet import InstanceTypeSummary, View, Views
from bus.settings import BusSettings
from controlplane import fleet as member
from controlplane import running as worker_running
from controlplane.gateway import running
from controlplane.gateway.settings import GatewaySettings
from controlplane.settings import WorkerSettings
from kit.serving import HttpsSettings

pytestmark = pytest.mark.anyio
H200 = "nvidia-h200-linux-amd64"


class Static:
    def __init__(self, *types: InstanceTypeSummary) -> None:
        self.types = list(types)

    def instance_types(self) -> Sequence[InstanceTypeSummary]:
        return self.types


def _h200(once: int, remaining: int, capacity: int) -> InstanceTypeSummary:
    view = View(once_max_request=once, remaining=remaining, capacity=capacity)
    return InstanceTypeSummary(name=H200, views=Views(accelerator=view))


def leaf_config(port: int) -> str:
    """The gateway side's leaf listener and the member's leaf user, as docs/gateway.md shows
    (plus a local user for the test's own clients)."""
    leaf = {"user": "member-west", "password": "s3cret",
            "permissions": identity.config_permissions(identity.leaf_permissions())}  # fmt: skip
    local = {"user": "local", "password": "local"}
    return "\n".join(
        (
            "authorization " + json.dumps({"users": [leaf, local]}),
            "leafnodes " + json.dumps({"listen": f"127.0.0.1:{port}"}),
        )
    )


def on_hub(hub: Any, **overrides: Any) -> BusSettings:
    return testing.settings_for(hub, user="local", password="local", **overrides)


@asynccontextmanager
async def linked_buses(tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    """A hub server with a leaf-node listener, and a member server linked to it."""
    leaf_port = embedded.free_port()
    async with embedded.embedded_server(
        tmp_path / "hub", extra_config=leaf_config(leaf_port)
    ) as hub:
        url = f"nats-leaf://member-west:s3cret@127.0.0.1:{leaf_port}"
        member_conf = f'leafnodes {{ remotes: [ {{ url: "{url}" }} ] }}'
        async with embedded.embedded_server(tmp_path / "west", extra_config=member_conf) as west:
            yield hub, west


@asynccontextmanager
async def answering(settings: BusSettings, cluster: str, source: Static) -> AsyncIterator[None]:
    async with (
        connection.connect(settings, name=f"worker/{cluster}") as conn,
        member.serve_summaries(conn, cluster, source, lambda: True),
    ):
        await conn.flush()
        yield


async def member_task(
    settings: BusSettings,
    cluster: str,
    source: Static,
    *,
    task_status: anyio.abc.TaskStatus[anyio.CancelScope] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """A member answering until its scope (handed to the starter) is cancelled."""
    with anyio.CancelScope() as scope:
        async with answering(settings, cluster, source):
            task_status.started(scope)
            await anyio.sleep_forever()


async def _get(sock: str, path: str) -> Any:
    connector = aiohttp.UnixConnector(path=sock)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(f"http://gateway{path}") as response,
    ):
        return response.status, await response.json(content_type=None)


def _settings(hub: Any, sock: Path) -> GatewaySettings:
    return GatewaySettings(
        bus=on_hub(hub, inbox_prefix="_INBOX.gateway"),
        unix_path=str(sock), https=HttpsSettings(auth="none"), kube=None,
        readiness_timeout_s=1.0, round_interval_s=0.3, settle_s=0.1,
    )  # fmt: skip


COLLECTION = "/apis/worker.gpustack.ai/v1alpha1/aggregatedinstancetypes"


async def _accelerator(sock: str) -> tuple[dict[str, int], list[str]]:
    status, body = await _get(sock, f"{COLLECTION}/{H200}")
    if status == 404:
        return {}, []
    assert status == 200, body
    members = [f"{m['cluster']}={m['state']}" for m in body["status"]["members"]]
    return body["status"]["accelerator"], members


async def test_two_linked_members_are_summed_and_a_stopped_one_leaves_the_totals(
    tmp_path: Path,
) -> None:
    sock = tmp_path / "gw.sock"
    async with linked_buses(tmp_path) as (hub, west_server), anyio.create_task_group() as tg:
        east_source, west_source = Static(_h200(8, 12, 16)), Static(_h200(4, 3, 8))
        await tg.start(member_task, on_hub(hub), "east", east_source)
        west = await tg.start(member_task, testing.settings_for(west_server), "west", west_source)
        gw = await tg.start(running.run, _settings(hub, sock))
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600

        async def both() -> bool:
            _acc, members = await _accelerator(str(sock))
            return members == ["east=Active", "west=Active"]

        await testing.eventually(both, timeout_s=15)
        acc, _ = await _accelerator(str(sock))
        assert acc == {"onceMaxRequest": 8, "remaining": 15, "capacity": 24}
        status, listed = await _get(str(sock), COLLECTION)
        assert status == 200 and listed["kind"] == "AggregatedInstanceTypeList"
        assert [i["metadata"]["name"] for i in listed["items"]] == [H200]

        west.cancel()  # member west stops answering

        async def west_gone() -> bool:
            _, members = await _accelerator(str(sock))
            return members == ["east=Active", "west=Unreachable"]

        await testing.eventually(west_gone, timeout_s=15)
        acc, _ = await _accelerator(str(sock))
        assert acc == {"onceMaxRequest": 8, "remaining": 12, "capacity": 16}

        west_source.types = [_h200(4, 1, 8)]
        await tg.start(member_task, testing.settings_for(west_server), "west", west_source)
        await testing.eventually(both, timeout_s=15)
        acc, _ = await _accelerator(str(sock))
        assert acc == {"onceMaxRequest": 8, "remaining": 13, "capacity": 24}
        assert gw.catalog.ready
        tg.cancel_scope.cancel()
    assert not sock.exists()


async def test_a_watch_streams_the_current_objects_then_changes(tmp_path: Path) -> None:
    sock = tmp_path / "gw.sock"
    source = Static(_h200(8, 8, 8))
    async with (
        linked_buses(tmp_path) as (hub, _),
        answering(on_hub(hub), "east", source),
        anyio.create_task_group() as tg,
    ):
        await tg.start(running.run, _settings(hub, sock))
        connector = aiohttp.UnixConnector(path=str(sock))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(f"http://gateway{COLLECTION}?watch=true") as response:
                assert response.status == 200
                seen: list[tuple[str, int]] = []
                with anyio.fail_after(20):
                    async for line in response.content:
                        event = msgspec.json.decode(line)
                        acc = event["object"]["status"]["accelerator"]
                        seen.append((event["type"], acc["remaining"]))
                        if seen[-1] == ("MODIFIED", 5):
                            break
                        if acc["remaining"] == 8:
                            source.types = [_h200(8, 5, 8)]
                assert ("MODIFIED", 5) in seen and seen[0][0] == "ADDED"
            async with session.get(f"http://gateway{COLLECTION}?watch=maybe") as response:
                assert response.status == 400
            async with session.get(f"http://gateway{COLLECTION}/nope") as response:
                assert response.status == 404
                assert (await response.json())["reason"] == "NotFound"
        tg.cancel_scope.cancel()


async def test_a_hostile_member_answer_is_dropped_and_counted(tmp_path: Path) -> None:
    sock = tmp_path / "gw.sock"
    async with (
        linked_buses(tmp_path) as (hub, _),
        connection.connect(on_hub(hub)) as conn,
    ):

        def hostile(payload: bytes, reply: str) -> None:
            tg.start_soon(conn.publish, reply, b'{"cluster": "../etc"}')

        async with anyio.create_task_group() as tg:
            async with conn.serve_requests("gpustack.v1.fleet.summary", hostile, queue="x"):
                await conn.flush()
                gw = await tg.start(running.run, _settings(hub, sock))

                async def two_rounds() -> bool:
                    return bool(gw.catalog.rounds >= 2)

                await testing.eventually(two_rounds, timeout_s=15)
                assert gw.catalog.members == {}
                status, body = await _get(str(sock), COLLECTION)
                assert status == 200 and body["items"] == []
            tg.cancel_scope.cancel()


async def test_a_stale_socket_is_replaced_but_a_file_is_not(tmp_path: Path) -> None:
    from kit.serving import ServingFailed

    path = tmp_path / "file"
    path.write_text("keep me")
    async with linked_buses(tmp_path) as (hub, _):
        with pytest.raises(ServingFailed, match="not a socket"):
            await running.run(_settings(hub, path))
    assert path.read_text() == "keep me"


async def test_the_leaf_link_carries_the_fleet_exchange_and_nothing_else(tmp_path: Path) -> None:
    """A node event or a JetStream call on a member's bus never reaches the gateway's bus."""
    async with (
        linked_buses(tmp_path) as (hub, west_server),
        connection.connect(on_hub(hub)) as hub_conn,
        connection.connect(testing.settings_for(west_server)) as on_west,
    ):
        seen: list[str] = []
        async with hub_conn.subscribe(">", lambda subject, _: seen.append(subject)):
            await hub_conn.flush()
            await anyio.sleep(1.0)  # the subscription's interest reaches the leaf link
            seen.clear()
            await on_west.publish("gpustack.v1.node.n1.devices", b"{}")
            await on_west.publish("_INBOX.worker.x", b"{}")
            await on_west.publish("_INBOX.gateway.probe", b"{}")
            await on_west.flush()
            await testing.eventually(_async_true_when(lambda: "_INBOX.gateway.probe" in seen))
        assert seen == ["_INBOX.gateway.probe"]


def _async_true_when(check: Any) -> Any:
    async def poll() -> bool:
        return bool(check())

    return poll


def _detected(name: str) -> tuple[DeviceGroup, ...]:
    here = Path(__file__).parent
    return msgspec.json.decode((here / name).read_bytes(), type=tuple[DeviceGroup, ...])


async def _agent_reports(settings: BusSettings, node: str, groups: tuple[DeviceGroup, ...]) -> None:
    """What a node's device agent publishes first: its devices (the worker's ledger takes it)."""
    event = events.DevicesEvent(node=node, ts=datetime.now(UTC), groups=groups)
    async with connection.connect(settings, name=f"agent/{node}") as conn:
        await conn.publish(subjects.subject(node, "devices"), codec.encode(event))
        await conn.flush()


async def test_two_real_workers_on_linked_buses_add_up(tmp_path: Path) -> None:
    """Two workers (bus ledger, no cluster), each on its own NATS, the second linked to the
    first as a leaf node; the gateway's totals are the hand-computed sums of their nodes."""
    sock = tmp_path / "gw.sock"
    https = HttpsSettings(bind_address="127.0.0.1", port=0, auth="none")
    async with linked_buses(tmp_path) as (hub, west_server), anyio.create_task_group() as tg:
        east_bus, west_bus = on_hub(hub), testing.settings_for(west_server)
        for bus, cluster in ((east_bus, "east"), (west_bus, "west")):
            worker = WorkerSettings(
                concurrency=16,
                bus=msgspec.structs.replace(bus, inbox_prefix="_INBOX.worker"), kube=None,
                https=https, leader_election=False, cluster_name=cluster,
            )  # fmt: skip
            await tg.start(worker_running.run, worker)
        await _agent_reports(east_bus, "e1", _detected("controlplane_detect_h200x8.json"))
        await _agent_reports(west_bus, "w1", _detected("controlplane_detect_h200x8.json"))
        await _agent_reports(west_bus, "w2", _detected("controlplane_detect_amd_x2.json"))
        gw = await tg.start(running.run, _settings(hub, sock))

        async def summed() -> bool:
            names = sorted(gw.catalog.objects)
            nvidia = [gw.catalog.objects[n] for n in names if "nvidia" in n]
            if not nvidia or len(nvidia[0]["status"]["members"]) != 2:
                return False
            return bool(nvidia[0]["status"]["accelerator"]["capacity"] == 16)

        await testing.eventually(summed, timeout_s=30)
        objects = gw.catalog.objects
        nvidia = next(o for n, o in objects.items() if "nvidia" in n)["status"]
        assert nvidia["accelerator"] == {"onceMaxRequest": 8, "remaining": 16, "capacity": 16}
        assert [t["clusters"] for t in nvidia["tiers"]["accelerator"]] == [["east", "west"]]
        amd = next(o for n, o in objects.items() if "amd" in n)["status"]
        assert amd["members"] == [{"cluster": "west", "state": "Active"}]
        assert amd["accelerator"]["capacity"] == 2
        tg.cancel_scope.cancel()

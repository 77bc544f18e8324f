"""``dm serve`` allocates a sliced container by its own limits, read from ``pending.<node>``.

Real peers: a nats-server holding the worker's bucket, the fake kubelet, a grpcio Allocate.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.to_thread
import grpc
import pytest

from agent.serve.running import Running, run
from agent.serve.settings import ServeSettings
from agent.testing import FakeKubelet, unary
from bus import connection, kv, state, testing
from bus.records import PendingContainer, PendingContainers
from proto.deviceplugin import v1beta1 as dp

pytestmark = pytest.mark.anyio

SLICED = "nvidia.com/gpu.sliced"
NODE = "test-node"


def _container(pod: str, minute: int, *, memory: int, cores: int, units: int) -> PendingContainer:
    return PendingContainer(
        pod_uid=f"uid-{pod}", namespace="ns", pod=pod, container="main", resource=SLICED,
        units=units, memory_percentage=memory, cores_percentage=cores, count=1,
        created_at=datetime(2026, 1, 1, 0, minute, tzinfo=UTC),
    )  # fmt: skip


FIRST = _container("first", 0, memory=25, cores=50, units=400_000)
WHOLE = _container("whole", 1, memory=100, cores=100, units=1_600_000)


async def _allocate(path: Path, ids: list[str]) -> dp.AllocateResponse:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    response: dp.AllocateResponse = await anyio.to_thread.run_sync(
        unary, path, "/v1beta1.DevicePlugin/Allocate", request, dp.AllocateResponse.FromString
    )
    return response


async def _socket(kubelet: FakeKubelet, resource: str) -> Path:
    await kubelet.registered_all([resource])
    path = kubelet.endpoint(resource)
    assert path is not None
    return path


async def _seen(running: Running, count: int) -> None:
    async def check() -> bool:
        return len(running.pending()) == count

    await testing.eventually(check)


def _tokens_of_first_card(running: Running) -> tuple[str, list[str]]:
    (servicer,) = [s for s in running.plugins.servicers().values() if s.spec.resource == SLICED]
    tokens = sorted(servicer.spec.tokens, key=lambda t: (t.card, t.index))
    card = tokens[0].card
    return card, [t.id for t in tokens if t.card == card]


async def test_a_sliced_allocate_is_capped_charged_and_gated_by_the_pending_container(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    async with testing.nats_server(tmp_path) as server:
        bus = testing.settings_for(server)
        async with connection.connect(bus, retry=False) as conn:
            await state.ensure_streams(conn, bus)
            bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)  # as the worker does
            key = kv.pending_key(NODE)
            await bucket.put_record(key, PendingContainers(node=NODE, containers=(FIRST,)))
            settings = ServeSettings.for_tests(str(tmp_path), bus=bus, node_name=NODE)
            async with anyio.create_task_group() as tg:
                running: Running = await tg.start(run, settings)
                await _seen(running, 1)
                card, ids = _tokens_of_first_card(running)
                socket = await _socket(kubelet, SLICED)
                reply = await _allocate(socket, ids[:1])
                used = running.plugins.ledger().used(card)

                await bucket.put_record(
                    key, PendingContainers(node=NODE, containers=(FIRST, WHOLE))
                )
                await _seen(running, 2)
                with pytest.raises(grpc.RpcError) as refused:
                    await _allocate(socket, ids[1:2])
                after = running.plugins.ledger().used(card)
                tg.cancel_scope.cancel()

    envs = reply.container_responses[0].envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "35942m"  # floor(143,771 MiB × 25 %)
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "50"
    assert used == 400_000
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "1200000 units left, 1600000 asked" in (refused.value.details() or "")
    assert after == 400_000  # the refusal charged nothing


async def test_a_restarted_agent_keeps_the_charge_and_never_serves_a_container_twice(
    tmp_path: Path, kubelet: FakeKubelet
) -> None:
    second = _container("second", 2, memory=50, cores=100, units=800_000)
    async with testing.nats_server(tmp_path / "nats") as server:
        bus = testing.settings_for(server)
        async with connection.connect(bus, retry=False) as conn:
            await state.ensure_streams(conn, bus)
            bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
            key = kv.pending_key(NODE)
            await bucket.put_record(key, PendingContainers(node=NODE, containers=(FIRST,)))
            settings = ServeSettings.for_tests(str(tmp_path), bus=bus, node_name=NODE)
            async with anyio.create_task_group() as tg:
                running: Running = await tg.start(run, settings)
                await _seen(running, 1)
                card, ids = _tokens_of_first_card(running)
                await _allocate(await _socket(kubelet, SLICED), ids[:1])
                await testing.eventually(lambda: _published(running))
                tg.cancel_scope.cancel()

            kubelet.restart()  # a DaemonSet rollout: kubelet sees the plugin register again
            # FIRST is still pending (kubelet has not started it yet), SECOND arrives.
            await bucket.put_record(key, PendingContainers(node=NODE, containers=(FIRST, second)))
            async with anyio.create_task_group() as tg:
                running = await tg.start(run, settings)
                await _seen(running, 2)
                kept = running.plugins.ledger().used(card)
                socket = await _socket(kubelet, SLICED)
                retry = await _allocate(socket, ids[:1])  # kubelet retrying FIRST
                reply = await _allocate(socket, ids[1:2])  # the next one is SECOND's
                used = running.plugins.ledger().used(card)
                tg.cancel_scope.cancel()

    assert kept == 400_000  # FIRST's own units, not a 1/128 token share
    assert retry.container_responses[0].envs["CUDA_DEVICE_SM_LIMIT"] == "50"
    envs = reply.container_responses[0].envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "71885m"  # SECOND's 50 %, not FIRST's 25 %
    assert used == 400_000 + 800_000


async def _published(running: Running) -> bool:
    return running.publisher.pending == 0

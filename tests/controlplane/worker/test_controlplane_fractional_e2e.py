"""Fractional GPUs end to end: admitted, pending, allocated, capped, charged, written back.

Real peers throughout: the worker (its Pod webhooks over HTTPS, its Pod watch, its annotation
writer) against the stateful fake API over HTTP; a real nats-server; the real ``dm serve`` with a
simulated H200 node; a grpcio client playing kubelet's Allocate on the plugin's own socket. Only
the cards and the cluster are fake.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.to_thread
import grpc
import pytest
from admission_helpers import apply_patch, container, patch_of, pod, review
from controlplane_fakeapi import FakeApi, fake_api, node
from test_controlplane_worker import worker_settings

from agent.serve import running as agent_running
from agent.serve.settings import ServeSettings
from agent.testing import FakeKubelet, fake_kubelet, unary
from bus.testing import eventually, nats_server, settings_for
from controlplane.admission.webhooks import MUTATE_PATH
from controlplane.reconciling.annotating import ANNOTATION
from controlplane.worker import running
from proto.deviceplugin import v1beta1 as dp

pytestmark = pytest.mark.anyio

NODE = "test-node"
SLICED = "nvidia.com/gpu.sliced"
PODS = "api/v1/pods"
DEVICES = "apis/worker.gpustack.ai/v1alpha1/devices"
H200_MIB = 143_771


@dataclass
class Cluster:
    fake: FakeApi
    worker: running.Worker
    agent: agent_running.Running
    kubelet: FakeKubelet
    session: aiohttp.ClientSession

    async def admit(self, name: str, limits: dict[str, str]) -> dict[str, Any]:
        """The Pod through the worker's mutating webhook, then bound to the node, not started."""
        obj = pod(container("main", limits))
        obj["metadata"] = {"name": name, "namespace": "team-a"}
        url = self.worker.url + MUTATE_PATH
        async with self.session.post(url, json=review(obj), ssl=False) as r:
            assert r.status == 200
            answer = await r.json()
        assert answer["response"]["allowed"] is True
        mutated: dict[str, Any] = apply_patch(obj, patch_of(answer["response"]))
        mutated["spec"]["nodeName"] = NODE
        mutated["status"] = {"phase": "Pending"}
        return self.fake.put_object(PODS, mutated)

    async def pending(self, count: int) -> None:
        async def seen() -> bool:
            return len(self.agent.pending()) == count

        await eventually(seen, timeout_s=20)

    def first_card(self, resource: str = SLICED) -> tuple[str, list[str]]:
        (servicer,) = [
            s for s in self.agent.plugins.servicers().values() if s.spec.resource == resource
        ]
        tokens = sorted(servicer.spec.tokens, key=lambda t: (t.card, t.index))
        return tokens[0].card, [t.id for t in tokens if t.card == tokens[0].card]

    async def allocate(self, ids: list[str], resource: str = SLICED) -> dp.AllocateResponse:
        await self.kubelet.registered_all([resource])
        path = self.kubelet.endpoint(resource)
        assert path is not None
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
        )
        reply: dp.AllocateResponse = await anyio.to_thread.run_sync(
            unary, path, "/v1beta1.DevicePlugin/Allocate", request, dp.AllocateResponse.FromString
        )
        return reply


@asynccontextmanager
async def cluster(tmp_path: Path, simulate: str = "nvidia-h200x8") -> AsyncIterator[Cluster]:
    async with (
        nats_server(tmp_path / "nats") as server,
        fake_api() as (fake, url),
        anyio.create_task_group() as tg,
        aiohttp.ClientSession() as session,
    ):
        bus = settings_for(server)
        fake.put_object("api/v1/nodes", node(NODE))
        with fake_kubelet(tmp_path / "kubelet.sock") as kubelet:
            worker: running.Worker = await tg.start(
                running.run, worker_settings(bus, url, leader=None)
            )
            serve = ServeSettings.for_tests(
                str(tmp_path), bus=bus, node_name=NODE, simulate=simulate
            )
            agent: agent_running.Running = await tg.start(agent_running.run, serve)
            yield Cluster(fake, worker, agent, kubelet, session)
            tg.cancel_scope.cancel()


def _slice(memory: str, cores: str) -> dict[str, str]:
    return {
        SLICED: "1",
        f"{SLICED}.memory-percentage": memory,
        f"{SLICED}.cores-percentage": cores,
    }


async def test_a_quarter_of_an_h200_is_admitted_allocated_capped_charged_and_annotated(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as c:
        quarter = await c.admit("quarter", _slice("25", "50"))
        await c.pending(1)
        card, ids = c.first_card()
        reply = await c.allocate(ids[:1])
        used = c.agent.plugins.ledger().used(card)

        async def annotated() -> bool:
            meta = c.fake.get(PODS, "quarter", "team-a")["metadata"]
            return ANNOTATION in (meta.get("annotations") or {})

        await eventually(annotated, timeout_s=20)
        written = c.fake.get(PODS, "quarter", "team-a")["metadata"]["annotations"][ANNOTATION]

        async def charged() -> bool:
            devices = c.fake.objects.get((DEVICES, None, NODE)) or {}
            cards = [a for g in (devices.get("status") or {}).get("groups", [])
                     for a in g["accelerators"] if a["id"] == card]  # fmt: skip
            return bool(cards) and cards[0]["allocated"] == 400_000

        await eventually(charged, timeout_s=20)
        status = c.fake.get(DEVICES, NODE)["status"]

        await c.admit("whole", _slice("100", "100"))  # no longer fits beside the quarter
        await c.pending(2)
        with pytest.raises(grpc.RpcError) as refused:
            await c.allocate(ids[1:2])
        after = c.agent.plugins.ledger().used(card)

    assert quarter["spec"]["containers"][0]["resources"]["limits"][f"{SLICED}.units"] == "400000"
    envs = reply.container_responses[0].envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{H200_MIB * 25 // 100}m"  # 35942m
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "50"
    assert used == 400_000
    (held,) = json.loads(written)["main"]["devices"]["groups"][0]["accelerators"]
    assert (held["id"], held["mode"], held["allocated"]) == (card, 3, 400_000)
    assert (held["memoryMib"], held["coresPercentage"]) == (35_942, 50)
    (acc,) = [a for g in status["groups"] for a in g["accelerators"] if a["id"] == card]
    assert (acc["mode"], acc["remaining"], acc["allocatedSlices"]) == ("Sliced", 1_200_000, 1)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "1200000 units left, 1600000 asked" in (refused.value.details() or "")
    assert after == 400_000


PARTITIONED = "nvidia.com/gpu.partitioned"


async def test_a_mig_partition_gets_the_profile_its_container_named(tmp_path: Path) -> None:
    async with cluster(tmp_path, simulate="nvidia-h100x8-mig") as c:

        async def knows_the_cards() -> bool:  # the MIG profile fold needs the node's cards
            state = c.worker.processor.ledger.get(NODE)
            return state is not None and state.groups is not None

        await eventually(knows_the_cards, timeout_s=20)
        part = await c.admit("part", {PARTITIONED: "1", f"{PARTITIONED}.mig-3g.40gb": "1"})
        await c.pending(1)
        _, ids = c.first_card(PARTITIONED)
        reply = await c.allocate(ids[:1], PARTITIONED)

        async def annotated() -> bool:
            meta = c.fake.get(PODS, "part", "team-a")["metadata"]
            return ANNOTATION in (meta.get("annotations") or {})

        await eventually(annotated, timeout_s=20)
        written = c.fake.get(PODS, "part", "team-a")["metadata"]["annotations"][ANNOTATION]
        holdings = c.agent.plugins.ledger().holdings()

    units = int(part["spec"]["containers"][0]["resources"]["limits"][f"{PARTITIONED}.units"])
    mig = reply.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
    assert mig.startswith("MIG-")
    (holding,) = holdings
    assert (holding.profile, holding.partition_id, holding.charges[0][1]) == ("3g.40gb", mig, units)
    (held,) = json.loads(written)["main"]["devices"]["groups"][0]["accelerators"]
    assert (held["mode"], held["allocated"]) == (4, units)
    assert (held["allocatedPhysicalProfile"], held["allocatedPhysicalID"]) == ("3g.40gb", mig)

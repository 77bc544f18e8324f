"""Pending sliced/partitioned containers: the pure selection and the Pod watch that pushes it.

The watch runs against the stateful fake API over HTTP and a real nats-server; what is checked is
the record the device agent would read under ``pending.<node>``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from controlplane_fakeapi import fake_api

from bus import connection, kv, records
from bus.testing import eventually, nats_server, settings_for
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.reconciling.pending import PendingPublisher, pending_for

PODS = "api/v1/pods"
SLICED = "nvidia.com/gpu.sliced"


def pod(
    name: str, limits: dict[str, Any], *, node: str = "n1", phase: str = "Pending",
    created: str = "2026-01-01T00:00:00Z", uid: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}",
                     "creationTimestamp": created},
        "spec": {"nodeName": node, "containers": [
            {"name": "side"}, {"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }  # fmt: skip


QUARTER = {SLICED: "1", f"{SLICED}.units": "400k", f"{SLICED}.memory-percentage": "25",
           f"{SLICED}.cores-percentage": "50"}  # fmt: skip


def test_a_sliced_container_bound_to_the_node_is_pending_with_what_it_asked() -> None:
    got = pending_for("n1", [pod("a", QUARTER)])
    assert got == records.PendingContainers(node="n1", containers=(records.PendingContainer(
        pod_uid="uid-a", namespace="ns", pod="a", container="main", resource=SLICED,
        units=400_000, memory_percentage=25, cores_percentage=50,
        created_at=datetime(2026, 1, 1, tzinfo=UTC)),))  # fmt: skip


def test_running_elsewhere_deleted_or_unsliced_pods_are_not_pending() -> None:
    deleted = pod("d", QUARTER)
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    pods = [pod("r", QUARTER, phase="Running"), pod("o", QUARTER, node="n2"), deleted,
            pod("x", {"nvidia.com/gpu": "1"}), pod("y", {SLICED: "1"})]  # fmt: skip
    assert pending_for("n1", pods).containers == ()


def test_the_oldest_comes_first_and_a_partition_names_its_profile() -> None:
    part = {"nvidia.com/gpu.partitioned": 1, "nvidia.com/gpu.partitioned.units": 533334,
            "nvidia.com/gpu.partitioned.mig-3g.47gb": 1}  # fmt: skip
    got = pending_for("n1", [pod("new", QUARTER, created="2026-01-02T00:00:00Z"),
                             pod("old", part)]).containers  # fmt: skip
    assert [(c.pod, c.resource, c.profile, c.units) for c in got] == [
        ("old", "nvidia.com/gpu.partitioned", "3g.47gb", 533334),
        ("new", SLICED, None, 400_000),
    ]


def test_a_pod_with_a_sidecar_lists_the_owner_and_the_sidecar_to_mirror() -> None:
    body = pod("s", {"nvidia.com/gpu": "2"})
    body["spec"]["containers"][0]["resources"] = {
        "limits": {"device.gpustack.ai/nvidia.visibility": "2"}}  # fmt: skip
    plain = pod("x", {"nvidia.com/gpu": "2"})  # no sidecar: nothing to mirror, not listed
    got = pending_for("n1", [body, plain]).containers
    assert [(c.pod, c.container, c.resource, c.count, c.units) for c in got] == [
        ("s", "main", "nvidia.com/gpu", 2, 3_200_000),
        ("s", "side", "device.gpustack.ai/nvidia.visibility", 2, 0),
    ]


async def _record(conn: connection.Connection, node: str) -> records.PendingContainers | None:
    got = await (await kv.open_bucket(conn, kv.AGENTS_BUCKET)).get(kv.pending_key(node))
    return None if got is None else msgspec.json.decode(got[0], type=records.PendingContainers)


@pytest.mark.anyio
async def test_the_worker_follows_pods_and_rewrites_each_nodes_record(tmp_path: Path) -> None:
    async with (
        nats_server(tmp_path) as server,
        fake_api() as (fake, url),
        connection.connect(settings_for(server), retry=False) as conn,
        open_client(KubeSettings.for_tests(url, backoff_s=0.01)) as api,
        anyio.create_task_group() as tg,
    ):
        agents = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
        await agents.put(kv.pending_key("gone"), b"{}")  # an earlier leader's stale record
        fake.put_object(PODS, pod("a", QUARTER))
        tg.start_soon(PendingPublisher(agents, retry_s=0.01).watch, api)

        async def pods_of(node: str) -> list[str] | None:
            rec = await _record(conn, node)
            return None if rec is None else [c.pod for c in rec.containers]

        await eventually(lambda: _is(pods_of("n1"), ["a"]))
        await eventually(lambda: _is(pods_of("gone"), None))
        fake.put_object(PODS, pod("b", QUARTER, node="n2"))
        await eventually(lambda: _is(pods_of("n2"), ["b"]))
        fake.put_object(PODS, pod("a", QUARTER, phase="Running"))  # the kubelet started it
        await eventually(lambda: _is(pods_of("n1"), None))
        fake.remove(PODS, "b", "ns")
        await eventually(lambda: _is(pods_of("n2"), None))
        tg.cancel_scope.cancel()


async def _is(got: Any, want: Any) -> bool:
    return bool(await got == want)

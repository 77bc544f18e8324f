"""The device plugins against a fake kubelet served by grpcio, over real unix sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread
import grpc
import pytest
from deviceplugin_harness import AMD, NVIDIA, with_health

from agent.deviceplugin.running import Plugins, device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from agent.testing import FakeKubelet, Watch, unary
from bus import devices, events
from bus.testing import eventually
from proto.deviceplugin import v1beta1 as dp
from proto.podresources import v1 as podresources

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own


@asynccontextmanager
async def _plugins(
    tmp_path: Path, groups: Sequence[devices.DeviceGroup], **kw: object
) -> AsyncIterator[tuple[Plugins, list[events.Event]]]:
    published: list[events.Event] = []
    settings = DevicePluginSettings.for_tests(str(tmp_path), **kw)
    async with device_plugins(settings, publish=published.append) as plugins:
        plugins.update(groups)
        yield plugins, published


async def _allocate(path: Path, ids: list[str]) -> dp.AllocateResponse:
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
    return await anyio.to_thread.run_sync(
        unary, path, "/v1beta1.DevicePlugin/Allocate", request, dp.AllocateResponse.FromString
    )


async def test_every_server_registers_with_its_socket_and_options(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h200: list[devices.DeviceGroup],
    rx7800: list[devices.DeviceGroup],
) -> None:
    async with _plugins(tmp_path, h200 + rx7800) as (plugins, _):
        await kubelet.registered_all(NVIDIA + AMD)
        options = await anyio.to_thread.run_sync(
            unary,
            tmp_path / "amd.sliced.sock",
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
            dp.Empty(),
            dp.DevicePluginOptions.FromString,
        )
        await eventually(lambda: _async(plugins.registrations >= 9))  # counted on the reply
        assert plugins.registrations == 9

    requests = {r.resource_name: r for r in kubelet.requests}
    assert sorted(requests) == sorted(NVIDIA + AMD)
    assert requests["nvidia.com/gpu.sliced"].endpoint == "nvidia.sliced.sock"
    assert requests["device.gpustack.ai/amd.visibility"].endpoint == "amd.visibility.sock"
    assert all(r.version == "v1beta1" for r in requests.values())
    assert all(r.options.get_preferred_allocation_available for r in requests.values())
    assert options.get_preferred_allocation_available
    assert kubelet.plugin_sockets() == []


async def test_a_kubelet_restart_recreates_and_reregisters_every_server(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h200: list[devices.DeviceGroup],
    rx7800: list[devices.DeviceGroup],
) -> None:
    async with _plugins(tmp_path, h200 + rx7800) as (plugins, _):
        await kubelet.registered_all(NVIDIA + AMD)
        # kubelet records a Register before it replies: a restart between the two would cost
        # the plugin a reply (a retry with the new kubelet, counted once, not twice)
        await eventually(lambda: _async(plugins.registrations >= 9))
        kubelet.restart()

        await kubelet.registered_all(NVIDIA + AMD, times=2)
        assert len(kubelet.plugin_sockets()) == 9
        # the new sockets serve: kubelet can watch them again
        watch = Watch(tmp_path / "amd.exclusive.sock")
        await eventually(lambda: _async(bool(watch.updates)))
        watch.close()
        # kubelet records a Register before replying; the plugin counts it on the reply
        await eventually(lambda: _async(plugins.registrations >= 18))
        assert plugins.registrations == 18


async def _async(value: bool) -> bool:
    return value


async def test_list_and_watch_follows_health_and_recovery(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    async with _plugins(tmp_path, h200) as (plugins, _):
        await kubelet.registered_all(NVIDIA)
        watch = Watch(tmp_path / "nvidia.exclusive.sock")
        try:
            await eventually(lambda: _async(len(watch.updates) == 1))
            plugins.update(h200)  # nothing changed: no update is sent
            plugins.update(with_health(h200, 3, unhealthy=True))
            await eventually(lambda: _async(len(watch.updates) == 2))
            plugins.update(with_health(h200, 3, unhealthy=False))
            await eventually(lambda: _async(len(watch.updates) == 3))
        finally:
            watch.close()

    card = h200[0].accelerators[3].id
    token = f"nvidia-h200:{card}:0000"
    assert [h[token] for h in watch.health()] == ["Healthy", "Unhealthy", "Healthy"]
    assert [len(h) for h in watch.health()] == [8, 8, 8]
    first = watch.updates[0].devices
    assert [d.topology.nodes[0].id for d in first] == [0, 0, 0, 0, 1, 1, 1, 1]


async def test_allocate_injects_per_vendor_and_publishes(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h200: list[devices.DeviceGroup],
    rx7800: list[devices.DeviceGroup],
) -> None:
    uuid = h200[0].accelerators[0].id
    amd = rx7800[0].accelerators[1]
    async with _plugins(tmp_path, h200 + rx7800) as (plugins, published):
        await kubelet.registered_all(NVIDIA + AMD)
        nvidia = await _allocate(tmp_path / "nvidia.exclusive.sock", [f"nvidia-h200:{uuid}:0000"])
        sliced = await _allocate(
            tmp_path / "nvidia.sliced.sock",
            [f"nvidia-h200:{h200[0].accelerators[1].id}:{i:04d}" for i in range(64)],
        )
        rocm = await _allocate(
            tmp_path / "amd.exclusive.sock", [f"radeon-rx-7800-xt:{amd.id}:0000"]
        )
        ledger = plugins.ledger()

    assert nvidia.container_responses[0].envs == {"NVIDIA_VISIBLE_DEVICES": uuid}
    assert sliced.container_responses[0].envs["CUDA_DEVICE_SM_LIMIT"] == "50"
    mounts = {m.container_path: m for m in sliced.container_responses[0].mounts}
    assert sorted(mounts) == [
        "/dev/shm",
        "/etc/ld.so.preload",
        "/tmp/vgpu",
        "/tmp/vgpulock",
        "/usr/local/vgpu/libvgpu.so",
    ]
    vgpu = anyio.Path(mounts["/tmp/vgpu"].host_path)
    assert await vgpu.is_dir()  # made before the reply
    assert vgpu.is_relative_to(tmp_path / "pods")
    assert rocm.container_responses[0].envs["ROCR_VISIBLE_DEVICES"] == amd.id
    assert amd.physical_indexes is not None
    assert [d.host_path for d in rocm.container_responses[0].devices] == [
        "/dev/kfd",
        f"/dev/dri/card{amd.physical_indexes[0]}",
        f"/dev/dri/renderD{amd.physical_indexes[1]}",
    ]
    assert [
        (e.action, e.resource, e.node) for e in published if isinstance(e, events.AllocationEvent)
    ] == [
        ("allocated", "nvidia.com/gpu", "test-node"),
        ("allocated", "nvidia.com/gpu.sliced", "test-node"),
        ("allocated", "amd.com/gpu", "test-node"),
    ]
    assert ledger.used(h200[0].accelerators[1].id) == 800_000


async def test_errors_reach_kubelet_as_grpc_statuses(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    uuid = h200[0].accelerators[0].id
    async with _plugins(tmp_path, h200) as (_, published):
        await kubelet.registered_all(NVIDIA)
        await _allocate(tmp_path / "nvidia.shared.sock", [f"nvidia-h200:{uuid}:0004"])
        with pytest.raises(grpc.RpcError) as malformed:
            await _allocate(tmp_path / "nvidia.exclusive.sock", ["not an id"])
        with pytest.raises(grpc.RpcError) as unknown:
            await _allocate(tmp_path / "nvidia.exclusive.sock", ["nvidia-h200:GPU-none:0000"])
        with pytest.raises(grpc.RpcError) as cross:
            await _allocate(tmp_path / "nvidia.exclusive.sock", [f"nvidia-h200:{uuid}:0000"])

    assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert cross.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert cross.value.details() == (
        f"card {uuid} (nvidia-h200 #0) is held in shared mode, cannot allocate it in exclusive mode"
    )
    assert len(published) == 1  # refusals change nothing


async def test_preferred_allocation_over_the_socket(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    accs = h200[0].accelerators
    available = [f"nvidia-h200:{a.id}:0000" for a in accs[2:]]
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_device_i_ds=available, allocation_size=3
            )
        ]
    )
    async with _plugins(tmp_path, h200) as _:
        await kubelet.registered_all(NVIDIA)
        reply = await anyio.to_thread.run_sync(
            unary,
            tmp_path / "nvidia.exclusive.sock",
            "/v1beta1.DevicePlugin/GetPreferredAllocation",
            request,
            dp.PreferredAllocationResponse.FromString,
        )

    assert reply.container_responses[0].device_i_ds == available[2:5]  # cards 4-6, NUMA node 1


async def test_no_switches_remove_servers_at_runtime(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    async with _plugins(tmp_path, h200, no_shared=True, no_sliced=True, no_partitioned=True):
        await kubelet.registered_all(["nvidia.com/gpu", "device.gpustack.ai/nvidia.visibility"])
        assert kubelet.plugin_sockets() == ["nvidia.exclusive.sock", "nvidia.visibility.sock"]

    assert sorted(kubelet.registered()) == [
        "device.gpustack.ai/nvidia.visibility",
        "nvidia.com/gpu",
    ]


async def test_a_vanished_manufacturer_loses_its_servers(
    tmp_path: Path,
    kubelet: FakeKubelet,
    h200: list[devices.DeviceGroup],
    rx7800: list[devices.DeviceGroup],
) -> None:
    async with _plugins(tmp_path, h200 + rx7800) as (plugins, _):
        await kubelet.registered_all(NVIDIA + AMD)
        plugins.update(h200)
        await eventually(
            lambda: _async(not any(s.startswith("amd.") for s in kubelet.plugin_sockets()))
        )
        assert len(kubelet.plugin_sockets()) == 5


async def test_registration_retries_until_kubelet_appears(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    kubelet = FakeKubelet(tmp_path / "kubelet.sock")
    async with _plugins(tmp_path, h200):
        await eventually(lambda: _async(len(kubelet.plugin_sockets()) == 5))
        kubelet.serve()
        try:
            await kubelet.registered_all(NVIDIA)
        finally:
            kubelet.stop()


async def test_stopping_mid_registration_leaves_no_socket_and_no_task(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    kubelet = FakeKubelet(tmp_path / "kubelet.sock", block_register=True)
    kubelet.serve()
    before = asyncio.all_tasks()
    try:
        async with _plugins(tmp_path, h200):
            await eventually(lambda: _async(kubelet.register_seen.is_set()))
            assert kubelet.plugin_sockets() != []
        assert kubelet.plugin_sockets() == []
        assert asyncio.all_tasks() == before
        assert kubelet.requests == []
    finally:
        kubelet.stop()


async def test_pod_resources_names_the_holder(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    token = f"nvidia-h200:{h200[0].accelerators[0].id}:0000"
    kubelet.serve_pod_resources(tmp_path / "pod-resources.sock")
    kubelet.live = [
        podresources.PodResources(
            name="llm",
            namespace="ai",
            containers=[
                podresources.ContainerResources(
                    name="main",
                    devices=[
                        podresources.ContainerDevices(
                            resource_name="nvidia.com/gpu", device_ids=[token]
                        )
                    ],
                )
            ],
        )
    ]
    socket = str(tmp_path / "pod-resources.sock")
    async with _plugins(tmp_path, h200, pod_resources_socket=socket) as (plugins, published):
        await kubelet.registered_all(NVIDIA)
        await _allocate(tmp_path / "nvidia.exclusive.sock", [token])
        await eventually(lambda: _async(len(published) == 2))
        holding = plugins.ledger().holdings()[0]

    assert (holding.pod_namespace, holding.pod_name, holding.container) == ("ai", "llm", "main")
    named = published[1]
    assert isinstance(named, events.AllocationEvent)
    assert named.allocation_id == f"nvidia.com/gpu/{token}"


async def test_retained_allocations_are_recharged_on_the_first_update(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    uuid = h200[0].accelerators[0].id
    retained = [
        events.AllocationEvent(
            node="test-node",
            allocation_id="x",
            action="allocated",
            resource="nvidia.com/gpu",
            device_ids=(f"nvidia-h200:{uuid}:0000",),
        )
    ]
    settings = DevicePluginSettings.for_tests(str(tmp_path))
    async with device_plugins(
        settings, publish=lambda e: None, initial_allocations=retained
    ) as plugins:
        assert plugins.ledger().holdings() == ()
        plugins.update(h200)
        assert plugins.ledger().mode_of(uuid) == "exclusive"
        await kubelet.registered_all(NVIDIA)
        with pytest.raises(grpc.RpcError) as cross:
            await _allocate(tmp_path / "nvidia.shared.sock", [f"nvidia-h200:{uuid}:0000"])

    assert cross.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_oversized_requests_are_refused_without_echoing_them(
    tmp_path: Path, kubelet: FakeKubelet, h200: list[devices.DeviceGroup]
) -> None:
    uuid = h200[0].accelerators[0].id
    huge = "x" * 1_000_000
    async with _plugins(tmp_path, h200) as (_, published):
        await kubelet.registered_all(NVIDIA)
        socket = tmp_path / "nvidia.exclusive.sock"
        with pytest.raises(grpc.RpcError) as long_id:
            await _allocate(socket, [huge])
        with pytest.raises(grpc.RpcError) as many_ids:
            await _allocate(socket, [f"nvidia-h200:{uuid}:{i:04}" for i in range(5000)])
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=["a"])] * 100
        )
        with pytest.raises(grpc.RpcError) as many_containers:
            await anyio.to_thread.run_sync(
                unary, socket, "/v1beta1.DevicePlugin/Allocate", request,
                dp.AllocateResponse.FromString,
            )  # fmt: skip
        # The agent still answers normally afterwards, and nothing was charged.
        await _allocate(socket, [f"nvidia-h200:{uuid}:0000"])

    for refused in (long_id, many_ids, many_containers):
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(refused.value.details() or "") < 300
    assert "1000000 characters; at most 256" in (long_id.value.details() or "")
    assert len(published) == 1

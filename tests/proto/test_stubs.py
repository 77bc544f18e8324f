"""The committed betterproto stubs speak the same wire protocol as kubelet and CSI sidecars.

Kubelet and the CSI sidecars are Go programs using grpc-go; the closest peer available in a
test is grpcio (gRPC C-core). So the interop tests serve the generated grpclib servicers on
a unix socket and call them with grpcio, sending and parsing bytes produced by betterproto:
if a method path, framing or field number were wrong, these calls would fail.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import grpc
import pytest

from agent import grpcsocket
from proto.csi import v1 as csi
from proto.deviceplugin import v1beta1 as dp
from proto.pluginregistration import PluginInfo, RegistrationBase
from proto.podresources import v1 as podresources

T = TypeVar("T")
CALL_TIMEOUT_S = 5.0


# ---------------------------------------------------------------- method paths


class _DevicePlugin(dp.DevicePluginBase):
    pass


class _KubeletRegistration(dp.RegistrationBase):
    pass


class _CsiNode(csi.NodeBase):
    pass


class _PluginRegistration(RegistrationBase):
    pass


class _PodResources(podresources.PodResourcesListerBase):
    pass


@pytest.mark.parametrize(
    ("servicer", "paths"),
    [
        (
            _DevicePlugin,
            {
                "/v1beta1.DevicePlugin/GetDevicePluginOptions",
                "/v1beta1.DevicePlugin/ListAndWatch",
                "/v1beta1.DevicePlugin/GetPreferredAllocation",
                "/v1beta1.DevicePlugin/Allocate",
                "/v1beta1.DevicePlugin/PreStartContainer",
            },
        ),
        (_KubeletRegistration, {"/v1beta1.Registration/Register"}),
        (
            _CsiNode,
            {
                "/csi.v1.Node/NodeStageVolume",
                "/csi.v1.Node/NodeUnstageVolume",
                "/csi.v1.Node/NodePublishVolume",
                "/csi.v1.Node/NodeUnpublishVolume",
                "/csi.v1.Node/NodeGetVolumeStats",
                "/csi.v1.Node/NodeExpandVolume",
                "/csi.v1.Node/NodeGetCapabilities",
                "/csi.v1.Node/NodeGetInfo",
            },
        ),
        (
            _PluginRegistration,
            {
                "/pluginregistration.Registration/GetInfo",
                "/pluginregistration.Registration/NotifyRegistrationStatus",
            },
        ),
        (
            _PodResources,
            {
                "/v1.PodResourcesLister/List",
                "/v1.PodResourcesLister/GetAllocatableResources",
                "/v1.PodResourcesLister/Get",
            },
        ),
    ],
)
def test_servicers_route_the_paths_the_peers_call(servicer: type[Any], paths: set[str]) -> None:
    assert set(servicer().__mapping__()) == paths


def test_csi_identity_paths_are_in_the_csi_v1_package() -> None:
    class Identity(csi.IdentityBase):
        pass

    assert set(Identity().__mapping__()) == {
        "/csi.v1.Identity/GetPluginInfo",
        "/csi.v1.Identity/GetPluginCapabilities",
        "/csi.v1.Identity/Probe",
    }


# ---------------------------------------------------------------- encoding


def _allocate_response() -> dp.AllocateResponse:
    return dp.AllocateResponse(
        container_responses=[
            dp.ContainerAllocateResponse(
                envs={"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"},
                mounts=[dp.Mount(container_path="/usr/lib/x", host_path="/opt/x", read_only=True)],
                devices=[
                    dp.DeviceSpec(
                        container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw"
                    )
                ],
                annotations={"gpustack.ai/devices": "GPU-1"},
                cdi_devices=[dp.CdiDevice(name="nvidia.com/gpu=GPU-1")],
            )
        ]
    )


def test_allocate_response_survives_a_round_trip() -> None:
    original = _allocate_response()

    decoded = dp.AllocateResponse().parse(bytes(original))

    assert decoded == original
    container = decoded.container_responses[0]
    assert container.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"}
    assert container.mounts[0].read_only is True
    assert container.devices[0].permissions == "rw"
    assert container.annotations == {"gpustack.ai/devices": "GPU-1"}
    assert [c.name for c in container.cdi_devices] == ["nvidia.com/gpu=GPU-1"]


@pytest.mark.parametrize(
    ("message", "wire"),
    [
        # field 1 (ID), length-delimited: tag 0x0a; field 2 (health): tag 0x12
        (dp.Device(id="x", health="Healthy"), b"\x0a\x01x\x12\x07Healthy"),
        # NUMANode.ID is field 1, varint: tag 0x08
        (dp.NumaNode(id=1), b"\x08\x01"),
        # cdi_devices is field 5 of ContainerAllocateResponse: tag (5 << 3) | 2 = 0x2a
        (
            dp.ContainerAllocateResponse(cdi_devices=[dp.CdiDevice(name="a")]),
            b"\x2a\x03\x0a\x01a",
        ),
        # RegisterRequest.options is field 4: tag 0x22, holding field 2 = true
        (
            dp.RegisterRequest(
                options=dp.DevicePluginOptions(get_preferred_allocation_available=True)
            ),
            b"\x22\x02\x10\x01",
        ),
        # BoolValue ready=false must still be sent (an empty wrapper), unlike "unset"
        (csi.ProbeResponse(ready=False), b"\x0a\x00"),
        (csi.ProbeResponse(), b""),
        # PodResources.cpu_ids is field 4, packed varints: tag 0x22
        (podresources.PodResources(cpu_ids=[1, 2]), b"\x22\x02\x01\x02"),
        # NodePublishVolumeRequest.target_path is field 4
        (csi.NodePublishVolumeRequest(target_path="/t"), b"\x22\x02/t"),
    ],
)
def test_fields_land_on_their_upstream_numbers(message: Any, wire: bytes) -> None:
    assert bytes(message) == wire


def test_plugin_info_encodes_supported_versions_as_field_4() -> None:
    info = PluginInfo(type="DevicePlugin", supported_versions=["v1beta1"])

    assert bytes(info) == b"\x0a\x0cDevicePlugin\x22\x07v1beta1"


# ---------------------------------------------------------------- interop with grpcio


class _ServingPlugin(dp.DevicePluginBase):
    async def get_device_plugin_options(self, empty: dp.Empty) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def list_and_watch(self, empty: dp.Empty) -> AsyncIterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(devices=[dp.Device(id="GPU-1", health="Healthy")])
        yield dp.ListAndWatchResponse(
            devices=[
                dp.Device(
                    id="GPU-1",
                    health="Unhealthy",
                    topology=dp.TopologyInfo(nodes=[dp.NumaNode(id=1)]),
                )
            ]
        )


class _ServingIdentity(csi.IdentityBase):
    async def get_plugin_info(
        self, get_plugin_info_request: csi.GetPluginInfoRequest
    ) -> csi.GetPluginInfoResponse:
        return csi.GetPluginInfoResponse(
            name="models.gpustack.ai", vendor_version="0.1.0", manifest={"commit": "abc"}
        )


@asynccontextmanager
async def _serving(handlers: Collection[Any], path: Path) -> AsyncIterator[str]:
    """A grpclib server on a unix socket, the agent's way (connections closed on exit)."""
    async with grpcsocket.unix_server(path, handlers):
        yield f"unix:{path}"


def _unary(target: str, method: str, request: Any, reply: Callable[[bytes], T]) -> T:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=reply)
        result: T = call(request, timeout=CALL_TIMEOUT_S)
        return result


def _stream(target: str, method: str, request: Any, reply: Callable[[bytes], T]) -> list[T]:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_stream(method, request_serializer=bytes, response_deserializer=reply)
        return list(call(request, timeout=CALL_TIMEOUT_S))


@pytest.mark.anyio
async def test_grpcio_client_reads_grpclib_device_plugin(tmp_path: Path) -> None:
    async with _serving([_ServingPlugin()], tmp_path / "dp.sock") as target:
        options = await anyio.to_thread.run_sync(
            _unary,
            target,
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
            dp.Empty(),
            dp.DevicePluginOptions.FromString,
        )
        updates = await anyio.to_thread.run_sync(
            _stream,
            target,
            "/v1beta1.DevicePlugin/ListAndWatch",
            dp.Empty(),
            dp.ListAndWatchResponse.FromString,
        )

    assert options == dp.DevicePluginOptions(get_preferred_allocation_available=True)
    assert [[(d.id, d.health) for d in u.devices] for u in updates] == [
        [("GPU-1", "Healthy")],
        [("GPU-1", "Unhealthy")],
    ]
    assert updates[1].devices[0].topology.nodes[0].id == 1


@pytest.mark.anyio
async def test_unimplemented_rpc_reaches_grpcio_as_unimplemented(tmp_path: Path) -> None:
    async with _serving([_ServingPlugin()], tmp_path / "dp.sock") as target:
        with pytest.raises(grpc.RpcError) as caught:
            await anyio.to_thread.run_sync(
                _unary,
                target,
                "/v1beta1.DevicePlugin/Allocate",
                dp.AllocateRequest(),
                dp.AllocateResponse.FromString,
            )

    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.anyio
async def test_grpcio_client_reads_grpclib_csi_identity(tmp_path: Path) -> None:
    async with _serving([_ServingIdentity()], tmp_path / "csi.sock") as target:
        info = await anyio.to_thread.run_sync(
            _unary,
            target,
            "/csi.v1.Identity/GetPluginInfo",
            csi.GetPluginInfoRequest(),
            csi.GetPluginInfoResponse.FromString,
        )

    assert info.name == "models.gpustack.ai"
    assert info.vendor_version == "0.1.0"
    assert info.manifest == {"commit": "abc"}

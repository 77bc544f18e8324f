"""Harness of the device-plugin tests (imported by conftest and the tests): simulated groups, and a fake kubelet served by grpcio.

Kubelet is a Go program on grpc-go; grpcio (gRPC C-core) is the independent implementation we
can run here, so registration, ListAndWatch and Allocate are exercised across two stacks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any, TypeVar

import grpc

from agent.devices import detection, sources
from agent.settings import DetectSettings
from bus import devices
from proto.deviceplugin import v1beta1 as dp
from proto.podresources import v1 as podresources

T = TypeVar("T")
CALL_TIMEOUT_S = 5.0


def simulated(manufacturer: str, profile: str) -> list[devices.DeviceGroup]:
    settings = DetectSettings(manufacturers=(manufacturer,), simulate=profile)
    with sources.open_backends(settings) as backends:
        return detection.detect(backends).items


class FakeKubelet:
    """kubelet's Registration service (and optionally pod-resources) on unix sockets."""

    def __init__(self, path: Path, *, block_register: bool = False) -> None:
        self.path = path
        self.requests: list[dp.RegisterRequest] = []
        self.live: list[podresources.PodResources] = []
        self.pod_resources_path: Path | None = None
        self.block = threading.Event() if block_register else None
        self.register_seen = threading.Event()
        self._servers: list[grpc.Server] = []
        self._lock = threading.Lock()

    def _register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:
        self.register_seen.set()
        if self.block is not None:
            self.block.wait(10)
        with self._lock:
            self.requests.append(request)
        return dp.Empty()

    def _list(self, request: Any, context: Any) -> podresources.ListPodResourcesResponse:
        return podresources.ListPodResourcesResponse(pod_resources=list(self.live))

    def registered(self) -> list[str]:
        with self._lock:
            return [r.resource_name for r in self.requests]

    def serve(self) -> None:
        registration = grpc.method_handlers_generic_handler(
            "v1beta1.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    self._register,
                    request_deserializer=dp.RegisterRequest.FromString,
                    response_serializer=bytes,
                )
            },
        )
        self._servers.append(_grpc_server(registration, self.path))

    def serve_pod_resources(self, path: Path) -> None:
        lister = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=podresources.ListPodResourcesRequest.FromString,
                    response_serializer=bytes,
                )
            },
        )
        self.pod_resources_path = path
        self._servers.append(_grpc_server(lister, path))

    def stop(self) -> None:
        if self.block is not None:
            self.block.set()
        for server in self._servers:
            server.stop(None).wait()
        self._servers.clear()
        self.path.unlink(missing_ok=True)


def _grpc_server(handler: Any, path: Path) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([handler])
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


def unary(path: Path, method: str, request: Any, reply: Callable[[bytes], T]) -> T:
    """One grpcio call to a plugin socket (run it in a thread)."""
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=reply)
        result: T = call(request, timeout=CALL_TIMEOUT_S)
        return result


class Watch:
    """A ListAndWatch stream read by kubelet-like grpcio code in a thread."""

    def __init__(self, path: Path) -> None:
        self.updates: list[dp.ListAndWatchResponse] = []
        self._channel = grpc.insecure_channel(f"unix:{path}")
        stream = self._channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=bytes,
            response_deserializer=dp.ListAndWatchResponse.FromString,
        )
        self._call = stream(dp.Empty())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for update in self._call:
                self.updates.append(update)
        except grpc.RpcError:
            pass

    def health(self) -> list[dict[str, str]]:
        return [{d.id: d.health for d in u.devices} for u in list(self.updates)]

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()
        self._thread.join(5)

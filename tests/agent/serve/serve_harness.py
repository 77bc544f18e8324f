"""A grpcio fake kubelet and a ListAndWatch reader for the dm serve tests.

kubelet is a Go program on grpc-go; grpcio (gRPC C-core) is the independent stack available
here, so the agent's grpclib servers are registered and watched across two implementations.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from proto.deviceplugin import v1beta1 as dp


class Kubelet:
    """kubelet's Registration service on ``path``; remembers every RegisterRequest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._requests: list[dp.RegisterRequest] = []
        self._lock = threading.Lock()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="fake-kubelet")
        )
        handler = grpc.method_handlers_generic_handler(
            "v1beta1.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    self._register,
                    request_deserializer=dp.RegisterRequest.FromString,
                    response_serializer=bytes,
                )
            },
        )
        self._server.add_generic_rpc_handlers([handler])
        self._server.add_insecure_port(f"unix:{path}")
        self._server.start()

    def _register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:
        with self._lock:
            self._requests.append(request)
        return dp.Empty()

    def endpoint(self, resource: str) -> Path | None:
        with self._lock:
            for request in self._requests:
                if request.resource_name == resource:
                    return self.path.parent / request.endpoint
        return None

    def stop(self) -> None:
        self._server.stop(None).wait()
        self.path.unlink(missing_ok=True)


class Watch:
    """One ListAndWatch stream read the way kubelet does, in a grpcio thread."""

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

    def latest(self) -> dict[str, str]:
        updates = list(self.updates)
        return {d.id: d.health for d in updates[-1].devices} if updates else {}

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()
        self._thread.join(5)

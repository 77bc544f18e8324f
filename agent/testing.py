"""Test harness for the agent's gRPC servers: a fake kubelet and kubelet-like clients, on grpcio.

Production modules never import this (an import-linter contract says so). kubelet is a Go
program on grpc-go; grpcio (gRPC C-core) is the independent implementation we can run in
tests, so registration, ListAndWatch and Allocate are exercised across two stacks.

grpcio is a development dependency only: it is imported lazily, inside the functions that
need it, so importing this module never fails in a production install.

- :func:`fake_kubelet` / :class:`FakeKubelet`: kubelet's Registration service (and, on request, pod-resources) on
  unix sockets, served by grpcio threads; remembers every RegisterRequest;
- :class:`Watch`: one ListAndWatch stream read in a thread, the way kubelet reads it;
- :func:`unary`: one grpcio unary call to a plugin socket (blocking: run it in a thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bus.testing import eventually
from proto.deviceplugin import v1beta1 as dp
from proto.podresources import v1 as podresources

if TYPE_CHECKING:
    import grpc

__all__ = ["CALL_TIMEOUT_S", "FakeKubelet", "Watch", "fake_kubelet", "unary"]

T = TypeVar("T")
CALL_TIMEOUT_S = 5.0


class FakeKubelet:
    """kubelet's Registration service (and optionally pod-resources) on unix sockets.

    ``serve()`` starts Registration on ``path``; ``stop()`` stops every server and removes
    ``path``, so a test can simulate a kubelet restart with ``stop()`` then ``serve()``.
    With ``block_register`` each Register call waits (up to 10 s, or until ``stop()``)
    after setting ``register_seen`` and before being recorded.
    """

    def __init__(self, path: Path, *, block_register: bool = False) -> None:
        self.path = path
        self.requests: list[dp.RegisterRequest] = []
        self.live: list[podresources.PodResources] = []
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
        """The resource names registered so far, in arrival order."""
        with self._lock:
            return [r.resource_name for r in self.requests]

    def endpoint(self, resource: str) -> Path | None:
        """The socket path the plugin for ``resource`` registered, if it has."""
        with self._lock:
            for request in self.requests:
                if request.resource_name == resource:
                    return self.path.parent / request.endpoint
        return None

    async def registered_all(self, names: Sequence[str], *, times: int = 1) -> None:
        """Wait (bounded) until every resource in ``names`` registered at least ``times`` times."""

        async def check() -> bool:
            got = self.registered()
            return all(got.count(n) >= times for n in names)

        await eventually(check)

    def plugin_sockets(self) -> list[str]:
        """The names of the sockets beside kubelet's own (the plugins' endpoints), sorted."""
        return sorted(p.name for p in self.path.parent.glob("*.sock") if p != self.path)

    def restart(self) -> None:
        """What a kubelet restart looks like: it goes, every socket beside it is deleted, it comes back."""
        self.stop()
        for socket in self.path.parent.glob("*.sock"):
            socket.unlink()
        self.serve()

    def serve(self) -> None:
        self._servers.append(
            _unary_server(
                self.path,
                "v1beta1.Registration",
                "Register",
                self._register,
                dp.RegisterRequest.FromString,
            )
        )

    def serve_pod_resources(self, path: Path) -> None:
        self._servers.append(
            _unary_server(
                path,
                "v1.PodResourcesLister",
                "List",
                self._list,
                podresources.ListPodResourcesRequest.FromString,
            )
        )

    def stop(self) -> None:
        if self.block is not None:
            self.block.set()
        for server in self._servers:
            server.stop(None).wait()
        self._servers.clear()
        self.path.unlink(missing_ok=True)


@contextmanager
def fake_kubelet(path: Path) -> Iterator[FakeKubelet]:
    """A serving :class:`FakeKubelet` on ``path``, stopped (socket removed) on exit."""
    fake = FakeKubelet(path)
    fake.serve()
    try:
        yield fake
    finally:
        fake.stop()


def _unary_server(
    path: Path,
    service: str,
    method: str,
    behaviour: Callable[[Any, Any], Any],
    deserialize: Callable[[bytes], Any],
) -> grpc.Server:
    """A started grpcio server with one unary method on unix socket ``path``."""
    import grpc

    handler = grpc.method_handlers_generic_handler(
        service,
        {
            method: grpc.unary_unary_rpc_method_handler(
                behaviour, request_deserializer=deserialize, response_serializer=bytes
            )
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet")
    )
    server.add_generic_rpc_handlers([handler])
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


def unary(path: Path, method: str, request: Any, reply: Callable[[bytes], T]) -> T:
    """One grpcio call to a plugin socket (blocking: run it in a thread)."""
    import grpc

    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=reply)
        result: T = call(request, timeout=CALL_TIMEOUT_S)
        return result


class Watch:
    """A ListAndWatch stream read by kubelet-like grpcio code in a daemon thread.

    ``updates`` grows as the plugin sends; ``close()`` cancels the call, closes the channel
    and joins the reader (bounded), so no thread or socket outlives the test.
    """

    def __init__(self, path: Path) -> None:
        import grpc

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
        import grpc

        try:
            for update in self._call:
                self.updates.append(update)
        except grpc.RpcError:
            pass

    def health(self) -> list[dict[str, str]]:
        """Every update so far as ``{device id: health}``, oldest first."""
        return [{d.id: d.health for d in u.devices} for u in list(self.updates)]

    def latest(self) -> dict[str, str]:
        """The newest update as ``{device id: health}`` (empty before the first)."""
        updates = self.health()
        return updates[-1] if updates else {}

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()
        self._thread.join(5)

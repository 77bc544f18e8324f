"""One kubelet device-plugin server: the grpclib servicer of a resource and its unix socket.

The servicer outlives its socket: when kubelet restarts and deletes the socket, :mod:`registration`
binds a new one around the same servicer, so the advertised list and its change signal carry over.
Binding, closing and removing the socket is :mod:`agent.grpcsocket`'s; :class:`SocketServer` only
pairs a servicer with it (and with :class:`_Codec`).
Decisions are delegated to an :class:`Allocator` (the node state in :mod:`node`); this module only
translates between gRPC and those calls, and maps our errors to ``GRPCError`` in exactly one
place, :func:`_grpc_errors`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import anyio
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from agent import grpcsocket
from agent.deviceplugin import encoding, errors
from agent.deviceplugin.injection import Injection
from agent.deviceplugin.limits import check_requests
from agent.deviceplugin.resources import Mode, ServerSpec
from proto.deviceplugin import v1beta1 as dp

log = logging.getLogger(__name__)

Key = tuple[str, Mode]


class Allocator(Protocol):
    """The decisions a servicer asks for; raise :class:`errors.DevicePluginError` to refuse."""

    def allocate(self, key: Key, device_ids: Sequence[str]) -> Injection: ...

    async def ask_kubelet_first(self) -> None:
        """Before an Allocate: refresh which containers kubelet is waiting to allocate for."""

    async def allocate_partitioned(self, key: Key, device_ids: Sequence[str]) -> Injection: ...

    def prefer(
        self, key: Key, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...


_STATUS: dict[type[errors.DevicePluginError], Status] = {
    errors.BadRequest: Status.INVALID_ARGUMENT,
    errors.Conflict: Status.FAILED_PRECONDITION,
    errors.CannotInject: Status.FAILED_PRECONDITION,
    errors.Exhausted: Status.RESOURCE_EXHAUSTED,
    errors.ActuationFailed: Status.INTERNAL,
}


@contextlib.contextmanager
def _grpc_errors(resource: str) -> Iterator[None]:
    """The one place our errors become gRPC statuses; anything else is INTERNAL."""
    try:
        yield
    except errors.DevicePluginError as e:
        status = _STATUS.get(type(e), Status.INTERNAL)
        log.warning("%s: refused: %s", resource, e)
        raise GRPCError(status, str(e)) from e


LIST_AND_WATCH = "/v1beta1.DevicePlugin/ListAndWatch"


class _Codec(ProtoCodec):
    """grpclib's protobuf codec, with the hot replies encoded by :mod:`encoding`."""

    def encode(self, message: Any, message_type: Any) -> bytes:
        if isinstance(message, encoding.Listing):
            return message.wire
        if type(message) is dp.AllocateResponse and message_type is dp.AllocateResponse:
            return encoding.allocate_response(message)
        return super().encode(message, message_type)


class ResourceServicer(dp.DevicePluginBase):
    """Serves one (manufacturer, mode). Touched from the event loop thread only.

    ListAndWatch sends the full list on every change of the tokens (ids or health). The list is
    encoded once per change, on the first send after it, and every stream sends those bytes.
    """

    def __init__(self, spec: ServerSpec, allocator: Allocator) -> None:
        self.spec = spec
        self._allocator = allocator
        self._changed = anyio.Event()
        self._listing: encoding.Listing | None = None
        """The encoded list of ``spec.tokens``; None until the first send after a change."""
        self.updates_sent = 0

    def offer(self, spec: ServerSpec) -> bool:
        """Adopt ``spec``; wake ListAndWatch streams only when tokens or health changed.

        An equal list keeps the current spec object, which lets callers cache per list.
        """
        if spec.tokens == self.spec.tokens:
            return False
        self.spec = spec
        self._listing = None
        self._changed.set()
        self._changed = anyio.Event()
        return True

    def listing(self) -> encoding.Listing:
        """What ListAndWatch sends now: the full device list of the current spec."""
        if self._listing is None:
            self._listing = encoding.Listing(encoding.listing(self.spec.tokens))
        return self._listing

    def __mapping__(self) -> dict[str, Handler]:
        """grpclib's routing table: the generated one, but ListAndWatch sends encoded lists."""
        mapping = super().__mapping__()
        mapping[LIST_AND_WATCH] = Handler(
            self._list_and_watch, Cardinality.UNARY_STREAM, dp.Empty, dp.ListAndWatchResponse
        )
        return mapping

    async def _list_and_watch(self, stream: Stream[dp.Empty, encoding.Listing]) -> None:
        await stream.recv_message()
        while True:
            changed = self._changed  # grab before sending: a change during the send is not lost
            await stream.send_message(self.listing())
            self.updates_sent += 1
            await changed.wait()

    async def get_device_plugin_options(self, empty: dp.Empty) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    async def get_preferred_allocation(
        self, request: dp.PreferredAllocationRequest
    ) -> dp.PreferredAllocationResponse:
        with _grpc_errors(self.spec.resource):
            containers = request.container_requests
            check_requests(self.spec.resource, [c.available_device_i_ds for c in containers])
            check_requests(self.spec.resource, [c.must_include_device_i_ds for c in containers])
            chosen = [
                self._allocator.prefer(
                    self.spec.key,
                    c.available_device_i_ds,
                    c.must_include_device_i_ds,
                    c.allocation_size,
                )
                for c in request.container_requests
            ]
        return dp.PreferredAllocationResponse(
            container_responses=[dp.ContainerPreferredAllocationResponse(ids) for ids in chosen]
        )

    async def allocate(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        with _grpc_errors(self.spec.resource):
            check_requests(self.spec.resource, [c.devices_ids for c in request.container_requests])
            await self._allocator.ask_kubelet_first()
            if self.spec.mode == "partitioned":  # NVML actuation: awaits worker threads
                injections = [
                    await self._allocator.allocate_partitioned(self.spec.key, c.devices_ids)
                    for c in request.container_requests
                ]
            else:
                injections = [
                    self._allocator.allocate(self.spec.key, c.devices_ids)
                    for c in request.container_requests
                ]
        responses = [encoding.container_response(i) for i in injections]
        return dp.AllocateResponse(container_responses=responses)

    async def pre_start_container(
        self, request: dp.PreStartContainerRequest
    ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()


class SocketServer:
    """A servicer bound to a unix socket path by :func:`agent.grpcsocket.unix_server`.

    :mod:`registration` keeps one per (manufacturer, mode) and, when kubelet deletes the socket,
    stops it and starts a new one around the same servicer. :meth:`stop` leaves no socket file
    of ours behind, also after a cancelled :meth:`start`.
    """

    def __init__(self, servicer: ResourceServicer, path: str, *, close_timeout_s: float) -> None:
        self.servicer = servicer
        self.path = path
        self._close_timeout_s = close_timeout_s
        self._bound: grpcsocket.Bound | None = None
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        serving = grpcsocket.unix_server(
            self.path, [self.servicer], codec=_Codec(), close_timeout_s=self._close_timeout_s
        )
        self._bound = await self._stack.enter_async_context(serving)

    def intact(self) -> bool:
        """Whether our socket file is still the one we bound (kubelet deletes it on restart)."""
        return self._bound is not None and self._bound.intact()

    async def stop(self) -> None:
        """Close the server and its connections, then remove the socket if it is still ours."""
        self._bound = None
        await self._stack.aclose()

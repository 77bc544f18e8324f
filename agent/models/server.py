"""The CSI Identity and Node services on a unix socket (grpclib), mapping errors to codes.

Only what an inline-ephemeral, node-only plugin needs: no capabilities advertised, so kubelet
never stages. Every :class:`~agent.models.errors.ModelsError` maps to its gRPC status by type;
anything else is INTERNAL with a generic message (and the traceback in the log), never a crash.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import grpclib.const
import grpclib.server
from grpclib import GRPCError

from agent import grpcsocket
from agent.models.errors import ModelsError
from agent.models.settings import DRIVER
from agent.models.volumes import PublishRequest, Volumes
from proto.csi import v1 as csi

__all__ = ["Identity", "Node", "serving"]

log = logging.getLogger(__name__)
T = TypeVar("T")


async def _answer(what: str, call: Callable[[], Awaitable[T]]) -> T:
    try:
        return await call()
    except ModelsError as e:
        log.log(
            logging.INFO if e.code in ("ABORTED", "UNAVAILABLE") else logging.WARNING,
            "%s: %s: %s",
            what,
            e.code,
            e,
        )
        raise GRPCError(grpclib.const.Status[e.code], str(e)) from e
    except GRPCError:
        raise
    except Exception as e:
        log.exception("%s failed", what)
        raise GRPCError(grpclib.const.Status.INTERNAL, f"{what} failed: {type(e).__name__}") from e


class Identity(csi.IdentityBase):
    def __init__(self, version: str, ready: Callable[[], bool]) -> None:
        self._version = version
        self._ready = ready

    async def get_plugin_info(self, _: csi.GetPluginInfoRequest) -> csi.GetPluginInfoResponse:
        return csi.GetPluginInfoResponse(name=DRIVER, vendor_version=self._version)

    async def get_plugin_capabilities(
        self, _: csi.GetPluginCapabilitiesRequest
    ) -> csi.GetPluginCapabilitiesResponse:
        return csi.GetPluginCapabilitiesResponse(capabilities=[])

    async def probe(self, _: csi.ProbeRequest) -> csi.ProbeResponse:
        return csi.ProbeResponse(ready=self._ready())


class Node(csi.NodeBase):
    def __init__(self, node_id: str, volumes: Volumes) -> None:
        self._node_id = node_id
        self._volumes = volumes

    async def node_get_info(self, _: csi.NodeGetInfoRequest) -> csi.NodeGetInfoResponse:
        return csi.NodeGetInfoResponse(node_id=self._node_id)

    async def node_get_capabilities(
        self, _: csi.NodeGetCapabilitiesRequest
    ) -> csi.NodeGetCapabilitiesResponse:
        return csi.NodeGetCapabilitiesResponse(capabilities=[])

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        """The generated mapping, but NodePublishVolume gets its stream: it reads the deadline."""
        mapping = dict(super().__mapping__())
        path = "/csi.v1.Node/NodePublishVolume"
        generated = mapping[path]
        mapping[path] = grpclib.const.Handler(
            self._publish_stream,
            generated.cardinality,
            generated.request_type,
            generated.reply_type,
        )
        return mapping

    async def _publish_stream(
        self,
        stream: grpclib.server.Stream[csi.NodePublishVolumeRequest, csi.NodePublishVolumeResponse],
    ) -> None:
        request = await stream.recv_message()
        if request is None:
            raise GRPCError(grpclib.const.Status.INVALID_ARGUMENT, "no request message")
        remaining = stream.deadline.time_remaining() if stream.deadline is not None else None
        await stream.send_message(await self.node_publish_volume(request, remaining_s=remaining))

    async def node_publish_volume(
        self, request: csi.NodePublishVolumeRequest, *, remaining_s: float | None = None
    ) -> csi.NodePublishVolumeResponse:
        """Publish; ``remaining_s`` is what is left of the caller's deadline (None: none), so
        a download that ends before it mounts in this call (see :meth:`Volumes.publish`)."""
        capability = request.volume_capability
        mount = capability is not None and capability.is_set("mount")
        req = PublishRequest(
            volume_id=request.volume_id,
            target_path=request.target_path,
            context=dict(request.volume_context),
            secrets=dict(request.secrets),
            mount_capability=bool(mount),
        )
        await _answer(
            "NodePublishVolume", lambda: self._volumes.publish(req, remaining_s=remaining_s)
        )
        return csi.NodePublishVolumeResponse()

    async def node_unpublish_volume(
        self, request: csi.NodeUnpublishVolumeRequest
    ) -> csi.NodeUnpublishVolumeResponse:
        await _answer(
            "NodeUnpublishVolume",
            lambda: self._volumes.unpublish(request.volume_id, request.target_path),
        )
        return csi.NodeUnpublishVolumeResponse()


@asynccontextmanager
async def serving(path: Path, handlers: list[Any]) -> AsyncIterator[Path]:
    """Serve ``handlers`` on the unix socket ``path`` (replacing a stale one) until exit.

    The socket is :func:`agent.grpcsocket.unix_server`'s; this adds only its directory.
    """
    await anyio.to_thread.run_sync(
        functools.partial(path.parent.mkdir, parents=True, exist_ok=True)
    )
    async with grpcsocket.unix_server(path, handlers):
        yield path

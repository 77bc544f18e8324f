"""The aggregate a worker-gateway serves beside the worker, read for the extension API.

The gateway (``worker-gateway``, :mod:`controlplane.gateway`) serves HTTPS with a self-signed
certificate on a unix socket; the worker mirrors its ``GET /apis/instancetypes?aggregated=true``
(every subscribed cluster) as the read-only ``aggregatedinstancetypes`` of ``gpustack.ai/v1``,
reading the socket on each request (the list is small and the socket local, so there is no cache
to go stale). Such a sidecar runs in ``loopback`` mode (it reads this cluster with the Pod's
ServiceAccount), so before each read the worker subscribes this cluster to it as ``local``: a
repeat is a no-op to the gateway, and a restarted gateway is subscribed again by the next read. Nothing is verified on that TLS: the socket file's mode (0600) is what keeps other
users out, as for the GPUStack server's own client. A gateway that is absent, slow or answering
nonsense is one clear 503, never a hang: every read is bounded by ``timeout_s``.
"""

from __future__ import annotations

import ssl
from typing import Any, Final

import aiohttp
import msgspec

from controlplane.errors import ControlPlaneError

__all__ = ["GatewayReader", "GatewayUnavailable"]

PATH: Final = "/apis/instancetypes?aggregated=true"
SUBSCRIBE: Final = "/apis/workers?cluster=local"
GVKS: Final = {"gvks": ["worker.gpustack.ai/v1/InstanceType"]}
MAX_BYTES: Final = 16 * 1024 * 1024


class GatewayUnavailable(ControlPlaneError):
    """The gateway's socket did not answer with its list."""


class _Item(msgspec.Struct):
    name: str
    spec: dict[str, Any] = {}
    status: dict[str, Any] = {}


class _List(msgspec.Struct):
    items: list[_Item]


class _UnixTLS(aiohttp.UnixConnector):
    """aiohttp's unix connector speaks plain HTTP; the gateway's socket speaks TLS."""

    def __init__(self, path: str) -> None:
        super().__init__(path=path)
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: ASYNC109
        del req, traces, timeout  # the session's total timeout bounds the whole read
        _, proto = await self._loop.create_unix_connection(
            self._factory, self._path, ssl=self._tls, server_hostname="localhost"
        )
        return proto


class GatewayReader:
    def __init__(self, unix_path: str, *, timeout_s: float = 3.0) -> None:
        self.unix_path = unix_path
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def items(self) -> list[dict[str, Any]]:
        """The gateway's aggregated InstanceTypes as Kubernetes-style objects (no apiVersion).

        :raises GatewayUnavailable: no socket, no answer in time, a non-200 or an unreadable body.
        """
        try:
            async with (
                aiohttp.ClientSession(connector=_UnixTLS(self.unix_path),
                                      timeout=self._timeout) as session,
            ):  # fmt: skip
                async with session.post(f"https://localhost{SUBSCRIBE}", json=GVKS) as posted:
                    if posted.status != 200:
                        raise GatewayUnavailable(f"the worker-gateway answered {posted.status}")
                async with session.get(f"https://localhost{PATH}") as response:
                    if response.status != 200:
                        raise GatewayUnavailable(f"the worker-gateway answered {response.status}")
                    body = await response.content.read(MAX_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise GatewayUnavailable(f"the worker-gateway at {self.unix_path}: {e}") from e
        if len(body) > MAX_BYTES:
            raise GatewayUnavailable("the worker-gateway's list is too large")
        try:
            listed = msgspec.json.decode(body, type=_List).items
        except msgspec.DecodeError as e:
            raise GatewayUnavailable(f"the worker-gateway's list is unreadable: {e}") from e
        return [
            {"kind": "AggregatedInstanceType", "metadata": {"name": i.name}, "spec": i.spec,
             "status": i.status}
            for i in listed
        ]  # fmt: skip

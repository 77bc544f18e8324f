"""The fleet aggregate a worker-gateway serves beside the worker, read for the extension API.

The gateway (``worker-gateway``, :mod:`controlplane.gateway`) listens on a unix socket in the
worker's Pod; the worker mirrors its ``AggregatedInstanceType`` list as the read-only
``aggregatedinstancetypes`` of ``gpustack.ai/v1``, reading the socket on each request (the list is
small and the socket local, so there is no cache to go stale). A gateway that is absent, slow or
answering nonsense is one clear 503, never a hang: every read is bounded by ``timeout_s``.
"""

from __future__ import annotations

from typing import Any, Final

import aiohttp
import msgspec

from controlplane.errors import ControlPlaneError

__all__ = ["GatewayReader", "GatewayUnavailable"]

PATH: Final = "/apis/worker.gpustack.ai/v1alpha1/aggregatedinstancetypes"
MAX_BYTES: Final = 16 * 1024 * 1024


class GatewayUnavailable(ControlPlaneError):
    """The gateway's socket did not answer with its list."""


class _List(msgspec.Struct):
    items: list[dict[str, Any]]


class GatewayReader:
    def __init__(self, unix_path: str, *, timeout_s: float = 3.0) -> None:
        self.unix_path = unix_path
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def items(self) -> list[dict[str, Any]]:
        """The gateway's objects.

        :raises GatewayUnavailable: no socket, no answer in time, a non-200 or an unreadable body.
        """
        connector = aiohttp.UnixConnector(path=self.unix_path)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session,
                session.get(f"http://worker-gateway{PATH}") as response,
            ):
                if response.status != 200:
                    raise GatewayUnavailable(f"the worker-gateway answered {response.status}")
                body = await response.content.read(MAX_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise GatewayUnavailable(f"the worker-gateway at {self.unix_path}: {e}") from e
        if len(body) > MAX_BYTES:
            raise GatewayUnavailable("the worker-gateway's list is too large")
        try:
            return msgspec.json.decode(body, type=_List).items
        except msgspec.DecodeError as e:
            raise GatewayUnavailable(f"the worker-gateway's list is unreadable: {e}") from e

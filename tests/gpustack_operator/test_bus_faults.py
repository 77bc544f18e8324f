"""NATS faults under the running system: the agents come back to the bus by themselves.

The bus is set up as in a cluster and in ``standalone``: a JetStream server with the auth
callout, served by the worker (verifying tokens generated as ``standalone`` does), and the
device and model agents connecting with their tokens through it. Every client uses
production's connect timeout (5 s, the callout's own timeout too): with it, an agent whose
reconnect met a callout that did not answer got "Authorization Violation", nats-py closed its
client for good, and the agent never published again (issue 31).

No timed assertions: every wait is a condition with a generous timeout, which is the bound the
documentation states (docs/bus.md, *Reconnecting*).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import anyio
import msgspec
import pytest

from agent.models import running as models_running
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings
from agent.serve import running as agent_running
from agent.serve.settings import ServeSettings
from agent.testing import fake_kubelet
from bus import callout, connection, embedded, events, subscribing, testing
from bus.callout import Credentials, Grant
from bus.embedded import free_port
from bus.metrics import BusMetrics
from bus.settings import BusSettings
from controlplane.access.busauth import BusAuthSettings
from controlplane.worker import running
from gpustack_operator import standalone
from kit.serving import HttpsSettings

# Room for the generous waits below (a stalled callout alone takes two of its 5 s timeouts).
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(150)]

NODE = "gpu-1.example"
HTTPS = HttpsSettings(bind_address="127.0.0.1", port=0, auth="none")
RECOVERY_S = 60.0
"""The bound docs/bus.md states for every agent publishing again once the server answers (and
a worker serves the callout): one backoff (30 s at most) and a connect and a callout timeout."""


class StallingVerifier:
    """The worker's callout verifier, which can be made to hang: the callout responder is
    alive and subscribed but answers nothing, so the server times every connection out."""

    def __init__(self, verify: callout.Verifier) -> None:
        self._verify = verify
        self._open = anyio.Event()
        self._open.set()
        self.stalled = 0

    def stall(self) -> None:
        self._open = anyio.Event()

    def release(self) -> None:
        self._open.set()

    async def __call__(self, credentials: Credentials) -> Grant:
        if not self._open.is_set():
            self.stalled += 1
            await self._open.wait()
        return await self._verify(credentials)


def _models(tmp_path: Path, bus: BusSettings, port: int = 0) -> ModelManagerSettings:
    return ModelManagerSettings(
        node_name=NODE,
        kubelet_dir=tmp_path / "kubelet",
        cache_root=tmp_path / "cache",
        csi_socket=tmp_path / "csi.sock",
        https=msgspec.structs.replace(HTTPS, port=port),
        bus=bus,
        hub_endpoint="http://127.0.0.1:9",  # never asked: nothing is downloaded
    )


def _released(seq: int) -> events.AllocationEvent:
    """An allocation event of its own key (none coalesces another): published while the bus
    is down, each must reach it."""
    return events.AllocationEvent(
        node=NODE, allocation_id=f"gone-{seq}/main", action="released",
        resource="nvidia.com/gpu", device_ids=(f"GPU-{NODE}-0",),
    )  # fmt: skip


async def _seen_after(
    sub: subscribing.Subscription, wanted: Callable[[set[str], set[str]], bool]
) -> tuple[set[str], set[str]]:
    """Read ``sub`` until ``wanted(kinds, allocation ids)`` of what it delivered holds."""
    kinds: set[str] = set()
    allocations: set[str] = set()
    with anyio.fail_after(RECOVERY_S):
        async for event in sub:
            kinds.add(events.kind_of(event))
            if isinstance(event, events.AllocationEvent):
                allocations.add(event.allocation_id)
            if wanted(kinds, allocations):
                return kinds, allocations
    raise AssertionError("the subscription ended")


@pytest.mark.parametrize("fault", ["restart", "stalled-callout"])
async def test_every_agent_publishes_again_after_a_nats_fault(tmp_path: Path, fault: str) -> None:
    """The server restarts (same port and store) under the worker, the device agent and the
    model agent; with ``stalled-callout`` the callout responder also answers nothing for a
    while, so the server refuses every agent's first tries. Afterwards the device agent samples
    and the model agent reports again, and the events published meanwhile all arrive."""
    creds = standalone.generate_credentials(tmp_path / "auth", NODE)
    config = callout.server_config(
        issuer=creds.issuer.public_key, auth_user_nkey=creds.worker.public_key
    )
    verify = StallingVerifier(callout.token_table({t: i for i, t in creds.tokens.items()}))
    async with (
        embedded.embedded_server(tmp_path / "nats", extra_config=config) as server,
        anyio.create_task_group() as tg,
    ):
        # Production's connect timeout: the one that meets the callout's (5 s).
        base = BusSettings.for_tests(server.url, connect_timeout_s=5.0)
        bus = {role: creds.bus(base, server.url, role) for role in creds.identities}
        # The worker comes back after the agents, as a cluster's one worker after a NATS
        # restart does among hundreds of agents: their first tries meet no callout responder.
        bus["worker"] = msgspec.structs.replace(bus["worker"], reconnect_wait_s=3.0)
        worker = running.WorkerSettings(
            concurrency=16, bus=bus["worker"], kube=None, https=HTTPS,
            resync_s=300.0,
            bus_auth=BusAuthSettings(issuer_seed_file=str(creds.directory / "issuer.nk")),
        )  # fmt: skip
        await tg.start(functools.partial(running.run, worker, verify=verify))
        with fake_kubelet(tmp_path / "kubelet.sock"):
            settings = ServeSettings.for_tests(
                str(tmp_path), bus=bus["device-manager"], node_name=NODE
            )
            agent = await tg.start(agent_running.run, settings)
            tg.start_soon(
                models_running.serve, _models(tmp_path, bus["model-manager"]), MemoryPolicy()
            )
            # An administrator's view (the worker's NKey bypasses the callout).
            async with (
                connection.connect(bus["worker"], retry=False) as watch,
                subscribing.subscribe(
                    watch, settings=bus["worker"], metrics=BusMetrics(), node=NODE
                ) as sub,
            ):
                await _seen_after(sub, lambda kinds, _: {"samples", "models"} <= kinds)

                if fault == "stalled-callout":
                    verify.stall()
                await server.stop()
                held = [_released(seq) for seq in range(20)]
                for event in held:
                    agent.publisher.publish(event)
                await server.start()
                if fault == "stalled-callout":
                    # Each agent has one attempt at a time in front of the callout, so a third
                    # stalled request means an agent was refused (the server's callout timeout)
                    # and tried again: the moment nats-py used to give up for good.
                    await testing.eventually(lambda: _true(verify.stalled > 2), timeout_s=30)
                    verify.release()

                ids = {e.allocation_id for e in held}
                kinds, _ = await _seen_after(
                    sub, lambda kinds, seen: {"samples", "models"} <= kinds and ids <= seen
                )
                assert {"samples", "models"} <= kinds
                await testing.eventually(lambda: _true(agent.publisher.pending == 0))
        tg.cancel_scope.cancel()


async def _true(value: bool) -> bool:
    return value


async def _status(port: int, path: str) -> int:
    """GET over HTTPS from an endpoint with a certificate made at its start (not verified)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{port}{path}", ssl=context) as response,
    ):
        return response.status


def _answers(port: int, path: str, status: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            return await _status(port, path) == status
        except aiohttp.ClientError:
            return False

    return check


async def test_livez_fails_once_an_agent_is_off_the_bus_past_the_bound(tmp_path: Path) -> None:
    """With the bus gone for longer than ``max_offline_s``, both agents' ``/livez`` answer 503
    (kubelet restarts them) and the model agent's ``/readyz`` 503 at once; with the bus back,
    200 again. The device agent stays ready: it serves kubelet without the bus."""
    async with testing.nats_server(tmp_path) as server, anyio.create_task_group() as tg:
        bus = testing.settings_for(server, max_offline_s=1.0)
        with fake_kubelet(tmp_path / "kubelet.sock"):
            agent = await tg.start(
                agent_running.run, ServeSettings.for_tests(str(tmp_path), bus=bus, node_name=NODE)
            )
            models_port = free_port()
            tg.start_soon(models_running.serve, _models(tmp_path, bus, models_port), MemoryPolicy())
            device_port = agent.server.port
            await testing.eventually(_answers(device_port, "/livez", 200))
            await testing.eventually(_answers(device_port, "/readyz", 200))  # kubelet has all
            await testing.eventually(_answers(models_port, "/livez", 200), timeout_s=20)

            await server.stop()
            await testing.eventually(_answers(models_port, "/readyz", 503))
            await testing.eventually(_answers(device_port, "/livez", 503))
            await testing.eventually(_answers(models_port, "/livez", 503))
            assert await _status(device_port, "/readyz") == 200

            await server.start()
            await testing.eventually(_answers(device_port, "/livez", 200), timeout_s=30)
            await testing.eventually(_answers(models_port, "/livez", 200), timeout_s=30)
        tg.cancel_scope.cancel()

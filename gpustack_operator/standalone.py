"""``gpustack-operator standalone``: the whole system on one machine, with no cluster.

One process runs an embedded ``nats-server`` (JetStream, state in ``--state-dir``), the device
agent (real hardware, or ``--simulate PROFILE``), the model agent (its CSI socket and cache under
the state directory: with no kubelet nothing mounts, but its cache state reaches the worker), and
the worker keeping its ledger in the bus's
retained state (JetStream KV) instead of a Kubernetes API: the same reconcile code with a
different sink. It prints how to watch, and stops cleanly on Ctrl-C or SIGTERM, leaving no
process behind (the embedded server dies with its parent).

It lives in the launcher layer because it is the one place that composes ``agent`` and
``controlplane``; they still meet only on the bus.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import anyio
import anyio.abc
import msgspec

from agent import running as agent_running
from agent import serve_settings
from agent.models import running as models_running
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings
from bus import embedded
from bus.errors import BusError
from controlplane import running as worker_running
from kit import serving

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_USAGE = 2


class StandaloneSettings(msgspec.Struct, frozen=True, kw_only=True):
    state_dir: str
    nats_port: int
    agent: serve_settings.ServeSettings
    models: ModelManagerSettings
    worker: worker_running.WorkerSettings
    run_for_s: float = 0.0
    """Stop after this many seconds (demos, smoke tests); 0 runs until interrupted."""


def settings_from(
    values: Mapping[str, object], env: Mapping[str, str], *, version: str
) -> StandaloneSettings:
    """Build every component's settings from the standalone flags (the process edge)."""
    state_dir = cast(str, values.get("state_dir") or "") or _default_state_dir(env)
    device_values = {
        **values,
        "kube_socket": os.path.join(state_dir, "device-plugins", "kubelet.sock"),
        "secure_port": values.get("device_manager_port", 32443),
    }
    agent = serve_settings.settings_from(device_values, env, version=version)
    worker_values = {
        **values,
        "kubeconfig": "none",
        "secure_port": values.get("worker_port", 31443),
        "kube_leader_election": False,
    }
    worker = worker_running.settings_from(worker_values, env)
    models = ModelManagerSettings(
        node_name=agent.node_name,
        kubelet_dir=Path(state_dir, "kubelet"),
        cache_root=Path(state_dir, "models"),
        csi_socket=Path(state_dir, "csi", "csi.sock"),
        https=msgspec.structs.replace(
            agent.https, port=int(cast(int, values.get("model_manager_port", 32444)))
        ),
        bus=agent.bus,
        hub_endpoint=env.get("HF_ENDPOINT") or "https://huggingface.co",
        hub_token=env.get("HF_TOKEN") or None,
        version=version,
    )
    return StandaloneSettings(
        state_dir=state_dir,
        nats_port=int(cast(int, values.get("nats_port", 4222))),
        agent=agent,
        models=models,
        worker=worker,
        run_for_s=float(cast(float, values.get("run_for", 0.0))),
    )


def _default_state_dir(env: Mapping[str, str]) -> str:
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "gpustack-operator")


async def run(
    settings: StandaloneSettings,
    *,
    out: anyio.abc.ObjectSendStream[str] | None = None,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run every component until cancelled; ``task_status.started(nats_url)`` once all are up."""
    state = Path(settings.state_dir)
    for directory in ("device-plugins", "kubelet/pods", "models", "csi"):
        (state / directory).mkdir(parents=True, exist_ok=True)
    async with (
        embedded.embedded_server(state / "nats", port=settings.nats_port) as server,
        anyio.create_task_group() as tg,
    ):
        bus = msgspec.structs.replace(settings.agent.bus, url=server.url)
        worker_settings = msgspec.structs.replace(settings.worker, bus=bus)
        agent_settings = msgspec.structs.replace(settings.agent, bus=bus)
        worker = await tg.start(functools.partial(worker_running.run, worker_settings))
        agent = await tg.start(functools.partial(agent_running.run, agent_settings))
        models_settings = msgspec.structs.replace(settings.models, bus=bus)
        # The model agent follows the worker's KV records (store spec, artifacts) like on a node.
        tg.start_soon(models_running.serve, models_settings, MemoryPolicy(), name="model-agent")
        banner = _banner(server.url, agent.server.url, worker.url, settings)
        if out is not None:
            await out.send(banner)
        else:
            sys.stderr.write(banner)
        task_status.started(server.url)
        if settings.run_for_s > 0:
            await anyio.sleep(settings.run_for_s)
            tg.cancel_scope.cancel()


def _banner(nats_url: str, agent_url: str, worker_url: str, settings: StandaloneSettings) -> str:
    lines = [
        "",
        f"gpustack-operator standalone is running on node {settings.agent.node_name!r}.",
        f"  bus:             {nats_url} (state in {settings.state_dir})",
        f"  watch events:    gpustack-operator bus watch --nats-url {nats_url}",
        f"  device metrics:  {agent_url}/metrics  (snapshot: /monitor/snapshot)",
        f"  worker metrics:  {worker_url}/metrics",
        f"  model agent:     CSI on {settings.models.socket_path}",
        "  stop:            Ctrl-C",
        "",
    ]
    return "\n".join(lines) + "\n"


async def main(settings: StandaloneSettings) -> None:
    """Run until SIGTERM/SIGINT (or ``--run-for``), then stop within a bounded time."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as tg:

            async def stack() -> None:
                await run(settings)
                tg.cancel_scope.cancel()

            tg.start_soon(stack, name="standalone")
            async for signum in signals:
                log.info("%s received; stopping", signal.Signals(signum).name)
                tg.cancel_scope.deadline = anyio.current_time() + 15.0
                tg.cancel_scope.cancel()
                break


def standalone_command(values: dict[str, object], positionals: list[str]) -> int:
    """The ``standalone`` target."""
    from gpustack_operator import __version__

    if positionals:
        log.error("unexpected arguments: %s", " ".join(positionals))
        return EXIT_USAGE
    try:
        settings = settings_from(values, os.environ, version=__version__)
    except ValueError as e:
        log.error("standalone: %s", e)
        return EXIT_USAGE
    try:
        anyio.run(main, settings, backend_options={"use_uvloop": True})
    except (BusError, serving.ServingFailed, OSError) as e:
        log.error("standalone: %s", e)
        return EXIT_FAILED
    return 0

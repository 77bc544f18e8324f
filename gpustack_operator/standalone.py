"""``gpustack-operator standalone``: the whole system on one machine, with no cluster.

One process runs an embedded ``nats-server`` (JetStream, state in ``--state-dir``), the device
agent (real hardware, or ``--simulate PROFILE``), the model agent (its CSI socket and cache under
the state directory: with no kubelet nothing mounts, but its cache state reaches the worker), and
the worker keeping its ledger in the bus's
retained state (JetStream KV) instead of a Kubernetes API: the same reconcile code with a
different sink. With no API to review tokens, ``/metrics`` and the snapshots need none (the
extension API still answers 401 without one), and every endpoint binds ``127.0.0.1`` unless
``--bind-address`` says otherwise. The worker serves the Pod admission
webhooks too, answering from that ledger, so an AdmissionReview can be tried against the
simulated cards without a cluster. The dashboard page (:mod:`gpustack_operator.dashboard`)
serves on ``--dashboard-port``, reading the bus as the read-only ``dashboard`` identity. It
prints how to watch, and stops cleanly on Ctrl-C or
SIGTERM, leaving no
process behind (the embedded server dies with its parent). Should the server die first, it is
reaped and started again on the same port with the same store and configuration
(:func:`bus.embedded.keep_running`); every component redials by itself (:mod:`bus.connection`).

The embedded server enforces the same per-identity permissions as a cluster's
(:mod:`bus.identity`): the worker serves the auth callout, and every other component connects
with a token generated at start (:func:`generate_credentials`, files readable by this user
only), so nothing on this machine publishes as the agents or administers the streams without
those files. The banner's watch command names the read-only dashboard token.

It lives in the launcher layer because it is the one place that composes ``agent`` and
``controlplane``; they still meet only on the bus.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import msgspec

from agent.models import running as models_running
from agent.models.policy import MemoryPolicy
from agent.models.settings import ModelManagerSettings
from agent.serve import running as agent_running
from agent.serve import settings as serve_settings
from bus import callout, embedded, jwt
from bus.identity import Identity, inbox_prefix
from bus.settings import BusSettings
from controlplane.access.busauth import BusAuthSettings
from controlplane.admission import webhooks
from controlplane.chain import workloads
from controlplane.worker import running as worker_running
from controlplane.worker.settings import WorkerSettings
from gpustack_operator import logs
from gpustack_operator.dashboard import serving as dashboard_serving
from gpustack_operator.dashboard.serving import DashboardSettings
from hub import endpoints
from kit import files
from kit.httpsettings import HttpsSettings, https_at
from kit.options import Flags, Options, SettingsError
from kit.redaction import redact_urls

log = logging.getLogger(__name__)

RECONCILES: Final = 16
"""The embedded worker's reconciles at once: it serves this machine's one node (the worker
command sizes its pool by ``--gopool-worker-factor`` per core for a cluster's nodes)."""


class StandaloneSettings(msgspec.Struct, frozen=True, kw_only=True):
    state_dir: str
    nats_port: int
    agent: serve_settings.ServeSettings
    models: ModelManagerSettings
    worker: WorkerSettings
    run_for_s: float
    """Stop after this many seconds (demos, smoke tests); 0 runs until interrupted."""
    dashboard: DashboardSettings
    """The page, reading the bus as the ``dashboard`` identity (its bus and token filled in by :func:`run`)."""


class StandaloneFlags(Flags, frozen=True, kw_only=True):
    """The flags of ``standalone`` beside the device agent's (:class:`ServeFlags`)."""

    state_dir: str
    nats_port: int
    worker_port: int
    device_manager_port: int
    model_manager_port: int
    run_for: float
    dashboard_port: int
    bind_address: str
    cert_dir: str


def settings_from(options: Options) -> StandaloneSettings:
    """Build every component's settings from the standalone flags (the process edge).

    The bus URL is a placeholder until the embedded server has a port; :func:`run` fills it.
    """
    flags = options.read_flags(StandaloneFlags)
    state_dir = flags.state_dir or _default_state_dir(options.env)
    try:
        files.writable_directory(state_dir)  # /proc/self, a read-only or full disk: exit 2 now
    except files.InputRefused as e:
        raise SettingsError(f"--state-dir: {e}") from e
    bus = BusSettings()

    def https(port: int) -> HttpsSettings:
        # No Kubernetes API to review tokens with: open, on loopback unless told otherwise.
        return https_at(flags.bind_address, port, flags.cert_dir, "none")

    kube_socket = os.path.join(state_dir, "device-plugins", "kubelet.sock")
    agent = serve_settings.assemble(
        options,
        kube_socket=kube_socket,
        state_dir=os.path.join(state_dir, "device-manager"),
        https=https(flags.device_manager_port),
        bus=bus,
    )
    hub_env = endpoints.environment(options.env)  # the Hub conventions, as the model agent's
    try:
        hub_endpoint = endpoints.endpoint_from(None, options.env)
    except endpoints.InvalidName as e:
        raise SettingsError(f"HF_ENDPOINT: {e}") from e
    worker = WorkerSettings(
        bus=bus, kube=None, https=https(flags.worker_port),
        hub_endpoint=hub_endpoint, concurrency=RECONCILES,
    )  # fmt: skip
    models = ModelManagerSettings(
        node_name=agent.node_name,
        kubelet_dir=Path(state_dir, "kubelet"),
        cache_root=Path(state_dir, "models"),
        csi_socket=Path(state_dir, "csi", "csi.sock"),
        https=https(flags.model_manager_port),
        bus=bus,
        hub_endpoint=hub_endpoint,
        hub_token=hub_env.token,
        hub_env=hub_env,
        version=agent.version,
    )
    return StandaloneSettings(
        state_dir=state_dir,
        nats_port=flags.nats_port,
        agent=agent,
        models=models,
        worker=worker,
        run_for_s=flags.run_for,
        dashboard=DashboardSettings(
            bus=bus, bind_address=agent.https.bind_address, port=flags.dashboard_port
        ),
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
    address = settings.agent.https.bind_address
    if not ipaddress.ip_address(address).is_loopback:
        log.warning(
            "serving /metrics, the snapshots and the dashboard on %s to anyone, without tokens",
            address,
        )
    for directory in ("device-plugins", "kubelet/pods", "models", "csi"):
        (state / directory).mkdir(parents=True, exist_ok=True)
    creds = generate_credentials(state / "nats" / "auth", settings.agent.node_name)
    config = callout.server_config(
        issuer=creds.issuer.public_key, auth_user_nkey=creds.worker.public_key
    )
    async with (
        embedded.embedded_server(state / "nats", port=settings.nats_port, extra_config=config)
        as server,
        anyio.create_task_group() as tg,
    ):  # fmt: skip
        # A server that dies is started again, same port and store; every client redials.
        tg.start_soon(embedded.keep_running, server, name="nats-server-keeper")
        buses = {role: creds.bus(settings.agent.bus, server.url, role) for role in _ROLES}
        worker_settings = msgspec.structs.replace(
            settings.worker,
            bus=buses["worker"],
            bus_auth=BusAuthSettings(issuer_seed_file=str(creds.directory / "issuer.nk")),
        )
        # The worker serves the callout: every other component is verified by its token.
        verify = callout.token_table({t: i for i, t in creds.tokens.items()})
        worker = await tg.start(
            functools.partial(worker_running.run, worker_settings, verify=verify), name="worker"
        )
        agent_settings = msgspec.structs.replace(settings.agent, bus=buses["device-manager"])
        agent = await tg.start(
            functools.partial(agent_running.run, agent_settings), name="device-agent"
        )
        models_settings = msgspec.structs.replace(settings.models, bus=buses["model-manager"])
        # The model agent follows the worker's KV records (store spec, artifacts) like on a node.
        tg.start_soon(models_running.serve, models_settings, MemoryPolicy(), name="model-agent")
        page_settings = msgspec.structs.replace(settings.dashboard, bus=buses["dashboard"])
        page = await tg.start(dashboard_serving.serve, page_settings, name="dashboard")
        banner = _banner(server.url, agent.server.url, worker.url, page, settings, creds)
        await _show(banner, out)
        task_status.started(server.url)


async def _show(banner: str, out: anyio.abc.ObjectSendStream[str] | None) -> None:
    """To ``out`` (tests), else to stderr as it reads; one log entry when logs are JSON, so
    that every stderr line a collector reads still parses."""
    if out is not None:
        await out.send(banner)
    elif logs.json_lines():
        log.info("%s", banner.strip("\n"))
    else:
        sys.stderr.write(banner)


def _banner(
    nats_url: str,
    agent_url: str,
    worker_url: str,
    dashboard_url: str,
    settings: StandaloneSettings,
    creds: Credentials,
) -> str:
    nats_url = redact_urls(nats_url)  # people copy the banner into chats and tickets
    dashboard = creds.token_file("dashboard")  # a path, never the token itself
    watch = f"gpustack-operator bus watch --nats-url {nats_url} --nats-token-file {dashboard}"
    lines = [
        "",
        f"gpustack-operator standalone is running on node {settings.agent.node_name!r}.",
        f"  bus:             {nats_url} (state in {settings.state_dir})",
        f"  dashboard:       {dashboard_url}",
        f"  watch events:    {watch}",
        f"  device metrics:  {agent_url}/metrics  (snapshot: /monitor/snapshot)",
        f"  worker metrics:  {worker_url}/metrics",
        f"  pod webhooks:    {worker_url}{webhooks.MUTATE_PATH}, {worker_url}{webhooks.VALIDATE_PATH}",
        f"  workload hook:   {worker_url}{workloads.PATH}",
        f"  model agent:     CSI on {settings.models.socket_path}",
        "  stop:            Ctrl-C",
        "",
    ]
    return "\n".join(lines) + "\n"


_ROLES: Final = ("worker", "device-manager", "model-manager", "dashboard")


@dataclass(frozen=True)
class Credentials:
    """What ``standalone`` generates at every start (files 0600 in a 0700 directory): the
    callout issuer's account key, the worker's NKey (it bypasses the callout), and one token
    per other component, each proving one identity (:func:`bus.callout.token_table`)."""

    directory: Path
    issuer: jwt.NKey
    worker: jwt.NKey
    identities: dict[str, Identity]
    tokens: dict[Identity, str]

    def token_file(self, role: str) -> Path:
        return self.directory / f"{role}.token"

    def bus(self, base: BusSettings, url: str, role: str) -> BusSettings:
        """``base`` at ``url`` as ``role``: its credential and its inbox prefix."""
        ident = self.identities[role]
        if role == "worker":
            creds: dict[str, object] = {"nkey_seed_file": str(self.directory / "worker.nk")}
        else:
            creds = {"token_file": str(self.token_file(role))}
        return msgspec.structs.replace(base, url=url, inbox_prefix=inbox_prefix(ident), **creds)


def generate_credentials(directory: Path, node: str) -> Credentials:
    """Fresh keys and tokens for one run, written under ``directory`` for other local tools
    (``bus watch`` with the dashboard token, ``nats`` with the worker's seed)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    issuer, worker = jwt.NKey.generate("account"), jwt.NKey.generate("user")
    identities = {
        "worker": Identity(role="worker"),
        "device-manager": Identity(role="device-manager", node=node),
        "model-manager": Identity(role="model-manager", node=node),
        "dashboard": Identity(role="dashboard"),
    }
    tokens = {identities[r]: secrets.token_urlsafe(32) for r in _ROLES if r != "worker"}
    creds = Credentials(directory, issuer, worker, identities, tokens)
    _write_secret(directory / "issuer.nk", issuer.seed)
    _write_secret(directory / "worker.nk", worker.seed)
    for ident, token in tokens.items():
        _write_secret(creds.token_file(ident.role), token)
    return creds


def _write_secret(path: Path, text: str) -> None:
    """Write ``text`` readable by this user only (also when the file existed, wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text + "\n")


async def main(settings: StandaloneSettings) -> int:
    """The ``standalone`` service: every component until stopped, or for ``--run-for``."""
    with anyio.move_on_after(settings.run_for_s or math.inf):
        await run(settings)
    return 0

"""The model plugin's settings: one frozen object built at the command's edge.

Nothing below :mod:`agent.models.running` reads flags or the environment.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from agent.models.peering import PeerSettings
from agent.models.tuning import Tuning
from agent.settings import node_name_from
from bus import identity
from bus import settings as bus_settings
from bus.settings import BusSettings
from hub import endpoints, modelscope_env
from kit.httpsettings import HttpsSettings, ServingFlags, https_from
from kit.options import Flags, Options, SettingsError
from kit.version import package_version

__all__ = ["DRIVER", "ModelManagerSettings", "Tuning", "settings_from"]

DRIVER: Final = "model.csi.gpustack.ai"


class ModelManagerSettings(msgspec.Struct, frozen=True, kw_only=True):
    node_name: str
    kubelet_dir: Path = Path("/var/lib/kubelet")
    cache_root: Path = Path("/var/lib/gpustack/models")
    csi_socket: Path | None = None
    """None: ``<kubelet_dir>/plugins/model.csi.gpustack.ai/csi.sock``."""
    https: HttpsSettings = HttpsSettings(port=32444)
    bus: BusSettings | None = None
    """None: no bus (status stays local; used by tests and air-gapped debugging)."""
    hub_endpoint: str = endpoints.DEFAULT_ENDPOINT
    """``HF_ENDPOINT``; the NodeModelStore spec overrides it once synced."""
    hub_token: str | None = None
    """``HF_TOKEN`` (or the legacy variable, or the login file): used when a volume brings no
    ``token`` secret."""
    hub_env: endpoints.HubEnvironment = endpoints.HubEnvironment()
    """``HF_HUB_OFFLINE`` and the proxies (the token is ``hub_token``)."""
    modelscope_endpoint: str = modelscope_env.DEFAULT_ENDPOINT
    """``MODELSCOPE_ENDPOINT`` or ``MODELSCOPE_DOMAIN``; the NodeModelStore spec's
    ``hub.modelScopeEndpoint`` overrides it.
    A ModelScope volume uses its artifact's token only: the node has no default one (a Hugging
    Face token is never sent to ModelScope)."""
    version: str = "0.1.0"
    tuning: Tuning = Tuning()
    peers: PeerSettings = PeerSettings()
    """Peer delivery (``--peer-port``, ``--peer-address``); off by default."""

    @property
    def socket_path(self) -> Path:
        if self.csi_socket is not None:
            return self.csi_socket
        return self.kubelet_dir / "plugins" / DRIVER / "csi.sock"

    @property
    def pods_dir(self) -> Path:
        return self.kubelet_dir / "pods"


class ModelManagerFlags(Flags, frozen=True, kw_only=True):
    """The model agent's own flags."""

    kubelet_dir: str
    cache_root: str
    csi_socket: str
    peer_port: int
    peer_address: str


def settings_from(options: Options) -> ModelManagerSettings:
    """Build the settings of ``model-manager`` from its flags and the environment.

    Without ``--nats-url`` or ``NATS_URL`` the plugin runs with no bus (its status stays local).
    :raises SettingsError: a relative path, or a Hub endpoint that is not a URL.
    """
    flags = options.read_flags(ModelManagerFlags)
    paths = {"kubelet-dir": flags.kubelet_dir, "cache-root": flags.cache_root,
             "csi-socket": flags.csi_socket}  # fmt: skip
    for name, value in paths.items():
        if value and not value.startswith("/"):
            raise SettingsError(f"--{name} must be an absolute path, not {value!r}")
    nats = options.read_flags(bus_settings.NatsFlags)
    has_bus = bool(nats.nats_url or options.env.get("NATS_URL"))
    bus = bus_settings.from_flags(nats, options.env)
    try:
        hub_endpoint = endpoints.endpoint_from(None, options.env)
    except endpoints.InvalidName as e:
        raise SettingsError(f"HF_ENDPOINT: {e}") from e
    try:
        modelscope_endpoint = modelscope_env.endpoint_from(None, options.env)
    except endpoints.InvalidName as e:
        raise SettingsError(f"MODELSCOPE_ENDPOINT or MODELSCOPE_DOMAIN: {e}") from e
    hub_env = endpoints.environment(options.env)
    node = node_name_from(options)
    me = identity.Identity(role="model-manager", node=node)
    bus = msgspec.structs.replace(bus, inbox_prefix=identity.inbox_prefix(me))
    return ModelManagerSettings(
        peers=_peers_from(flags, options.env),
        node_name=node,
        kubelet_dir=Path(flags.kubelet_dir),
        cache_root=Path(flags.cache_root),
        csi_socket=Path(flags.csi_socket) if flags.csi_socket else None,
        https=https_from(options.read_flags(ServingFlags)),
        bus=bus if has_bus else None,
        hub_endpoint=hub_endpoint,
        hub_token=hub_env.token,
        hub_env=hub_env,
        modelscope_endpoint=modelscope_endpoint,
        version=package_version(),
        tuning=_tuning_for(bus),
    )


def _peers_from(flags: ModelManagerFlags, env: Mapping[str, str]) -> PeerSettings:
    """``--peer-port`` and ``--peer-address`` (else ``$POD_IP``); off with port 0.

    :raises SettingsError: a port without an address peers could reach, an address that is
        not an IP address, or ``--peer-address`` without ``--peer-port`` (it would do nothing).
    """
    port = flags.peer_port
    address = flags.peer_address or env.get("POD_IP", "")
    if not port:
        if flags.peer_address:
            raise SettingsError("--peer-address needs --peer-port: peer delivery is off without it")
        return PeerSettings()
    if not address:
        raise SettingsError("--peer-port needs --peer-address (or $POD_IP): where peers reach it")
    try:
        ipaddress.ip_address(address)
    except ValueError as e:
        raise SettingsError(f"--peer-address: {address!r} is not an IP address") from e
    return PeerSettings(port=port, address=address)


def _tuning_for(bus: BusSettings) -> Tuning:
    """The default tuning, republishing often enough for ``--nats-state-max-age`` (the
    model-manager has no resync flag of its own, so the period follows the expiry)."""
    most = bus.state_max_age_s / bus_settings.REPUBLISHES_PER_MAX_AGE
    return Tuning(resync_s=min(Tuning().resync_s, most))

"""The settings of ``dm serve``: one frozen object, built from flags and environment at the edge.

:func:`settings_from` is the only place that looks at flag values and the environment; every
component below receives its part (``detect``, ``bus``, ``https``, ``deviceplugin``) explicitly.
Durations are seconds and say so in their names.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from agent.deviceplugin.cdi import STRATEGIES, Strategy
from agent.deviceplugin.settings import DevicePluginSettings
from agent.devices.settings import DetectSettings, detection_from
from agent.settings import node_name_from
from bus import identity
from bus import settings as bus_settings
from bus.settings import BusSettings
from kit.httpsettings import HttpsSettings, ServingFlags, https_from
from kit.options import Flags, Options, SettingsError
from kit.version import package_version


class ServeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``dm serve`` needs to run."""

    node_name: str
    """The Kubernetes node name: ``--node-name``, else ``KUBERNETES_NODE_NAME``, else the host."""
    version: str
    detect: DetectSettings
    bus: BusSettings
    https: HttpsSettings
    deviceplugin: DevicePluginSettings
    monitor_period_s: float
    """Seconds between passes: detection, sampling and the health re-check."""
    resync_period_s: float
    """Seconds after which an unchanged Devices spec is published again."""
    heartbeat_s: float
    """Seconds between AgentEvents."""
    health_quarantine_s: float
    """Seconds a card down for a transient reason stays Unhealthy before it is re-checked."""
    xid_wait_s: float = 1.0
    """Seconds one NVML event wait may block a worker thread (bounds shutdown, not latency)."""
    state_dir: str
    """The node's own state (``--state-dir``): the ledger kept for a start without the bus."""
    metrics_http_port: int
    """``--metrics-port``: also serve ``/metrics`` over plain HTTP, with no token, on this port
    of the HTTPS endpoint's address (as DCGM exporter does on 9400); 0: not at all."""
    metrics_names: str
    """``--metrics-names``: ``gpustack``, ``dcgm`` or ``both`` (:data:`agent.serve.metrics.NAMINGS`)."""

    @property
    def ledger_path(self) -> Path:
        return Path(self.state_dir, "ledger.json")

    def __post_init__(self) -> None:
        for name in ("monitor_period_s", "resync_period_s", "heartbeat_s", "xid_wait_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name.removesuffix('_s').replace('_', '-')} must be positive")
        if self.health_quarantine_s < 0:
            raise ValueError("health-quarantine must not be negative")

    @classmethod
    def for_tests(
        cls, directory: str, *, bus: BusSettings, simulate: str = "nvidia-h200x8", **kw: object
    ) -> ServeSettings:
        """Short periods, a fake kubelet in ``directory``, HTTPS on a free loopback port, no
        plain-HTTP metrics, this operator's metric names."""
        base = cls(
            node_name="test-node",
            version="0.0.0-test",
            detect=DetectSettings(
                manufacturers=("amd", "nvidia"), fast_failed=False, simulate=simulate
            ),
            bus=bus,
            https=HttpsSettings(
                bind_address="127.0.0.1", port=0, shutdown_timeout_s=2.0, auth="none"
            ),
            deviceplugin=DevicePluginSettings.for_tests(directory),
            monitor_period_s=0.2,
            resync_period_s=60.0,
            heartbeat_s=0.5,
            health_quarantine_s=0.5,
            xid_wait_s=0.05,
            state_dir=os.path.join(directory, "device-manager"),
            metrics_http_port=0,
            metrics_names="gpustack",
        )
        return msgspec.structs.replace(base, **kw)


class ServeFlags(Flags, frozen=True, kw_only=True):
    """The device agent's own flags (``dm serve``, and ``standalone`` for its device agent)."""

    no_shared: bool
    no_sliced: bool
    no_partitioned: bool
    monitor_period: float
    resync_period: float
    heartbeat_period: float
    health_quarantine: float
    metrics_port: int
    metrics_names: str
    nvidia_device_injection_strategy: str


class PlacementFlags(Flags, frozen=True, kw_only=True):
    """Where ``dm serve`` keeps its socket and state (``standalone`` decides them itself)."""

    kube_socket: str
    state_dir: str


def settings_from(options: Options) -> ServeSettings:
    """Build the settings of ``dm serve`` from its flags and the environment.

    :raises SettingsError: a bad ``--manufacturer`` or node name, a relative ``--state-dir``.
    """
    place = options.read_flags(PlacementFlags)
    if not place.state_dir.startswith("/"):
        raise SettingsError(f"--state-dir must be an absolute path, not {place.state_dir!r}")
    return assemble(
        options,
        kube_socket=place.kube_socket,
        state_dir=place.state_dir,
        https=https_from(options.read_flags(ServingFlags)),
        bus=bus_settings.from_options(options),
    )


def assemble(
    options: Options, *, kube_socket: str, state_dir: str, https: HttpsSettings, bus: BusSettings
) -> ServeSettings:
    """The device agent's settings with the parts a composing command decides itself
    (``standalone`` puts the socket and the state under its state directory and the bus on its
    own server).

    :raises SettingsError: a republish period the retained state would expire between.
    """
    flags = options.read_flags(ServeFlags)
    node = node_name_from(options)
    bus_settings.check_republish("resync-period", flags.resync_period, bus)
    bus_settings.check_republish("heartbeat-period", flags.heartbeat_period, bus)
    me = identity.Identity(role="device-manager", node=node)
    return ServeSettings(
        node_name=node,
        version=package_version(),
        detect=detection_from(options),
        bus=msgspec.structs.replace(bus, inbox_prefix=identity.inbox_prefix(me)),
        https=https,
        deviceplugin=DevicePluginSettings(
            kube_socket=kube_socket,
            node_name=node,
            no_shared=flags.no_shared,
            no_sliced=flags.no_sliced,
            no_partitioned=flags.no_partitioned,
            nvidia_injection=injection_strategy(flags.nvidia_device_injection_strategy),
        ),
        monitor_period_s=flags.monitor_period,
        resync_period_s=flags.resync_period,
        heartbeat_s=flags.heartbeat_period,
        health_quarantine_s=flags.health_quarantine,
        state_dir=state_dir,
        metrics_http_port=flags.metrics_port,
        metrics_names=flags.metrics_names,
    )


def injection_strategy(value: str) -> Strategy:
    """``--nvidia-device-injection-strategy`` (the parser already refused other values)."""
    for strategy in STRATEGIES:
        if strategy == value:
            return strategy
    raise SettingsError(
        f"--nvidia-device-injection-strategy {value!r} is not one of {', '.join(STRATEGIES)}"
    )

"""The settings of ``dm serve``: one frozen object, built from flags and environment at the edge.

:func:`settings_from` is the only place that looks at flag values and the environment; every
component below receives its part (``detect``, ``bus``, ``https``, ``deviceplugin``) explicitly.
Durations are seconds and say so in their names.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import cast

import msgspec

from agent import oneshots
from agent.deviceplugin.settings import DevicePluginSettings
from agent.settings import DetectSettings
from bus import settings as bus_settings
from bus.settings import BusSettings
from kit.serving import HttpsSettings


class ServeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``dm serve`` needs to run."""

    node_name: str
    """The Kubernetes node name: ``--node-name``, else ``KUBERNETES_NODE_NAME``, else the host."""
    version: str
    detect: DetectSettings
    bus: BusSettings
    https: HttpsSettings
    deviceplugin: DevicePluginSettings
    monitor_period_s: float = 15.0
    """Seconds between passes: detection, sampling and the health re-check."""
    resync_period_s: float = 300.0
    """Seconds after which an unchanged Devices spec is published again."""
    heartbeat_s: float = 30.0
    """Seconds between AgentEvents."""
    health_quarantine_s: float = 300.0
    """Seconds a card down for a transient reason stays Unhealthy before it is re-checked."""
    xid_wait_s: float = 1.0
    """Seconds one NVML event wait may block a worker thread (bounds shutdown, not latency)."""
    shutdown_timeout_s: float = 10.0
    """Seconds the whole process may take to stop after SIGTERM before it is abandoned."""

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
        """Short periods, a fake kubelet in ``directory``, HTTPS on a free loopback port."""
        base = cls(
            node_name="test-node",
            version="0.0.0-test",
            detect=DetectSettings(
                manufacturers=("amd", "nvidia"), fast_failed=False, simulate=simulate
            ),
            bus=bus,
            https=HttpsSettings(bind_address="127.0.0.1", port=0, shutdown_timeout_s=2.0),
            deviceplugin=DevicePluginSettings.for_tests(directory),
            monitor_period_s=0.2,
            resync_period_s=60.0,
            heartbeat_s=0.5,
            health_quarantine_s=0.5,
            xid_wait_s=0.05,
            shutdown_timeout_s=5.0,
        )
        return msgspec.structs.replace(base, **kw)


def node_name_from(values: Mapping[str, object], env: Mapping[str, str]) -> str:
    return (
        cast(str, values.get("node_name") or "")
        or env.get("KUBERNETES_NODE_NAME", "")
        or socket.gethostname()
    )


def settings_from(
    values: Mapping[str, object], env: Mapping[str, str], *, version: str
) -> ServeSettings:
    """Build the settings from parsed flags (``values``) and the environment.

    :raises UnknownManufacturer: for a bad ``--manufacturer``.
    """
    node = node_name_from(values, env)
    detect = oneshots.settings_from({**values, "output": "yaml"}, env)
    cert_dir = cast(str, values.get("cert_dir") or "") or None
    return ServeSettings(
        node_name=node,
        version=version,
        detect=detect,
        bus=bus_settings.from_flags(values, env),
        https=HttpsSettings(
            bind_address=cast(str, values.get("bind_address") or "0.0.0.0"),
            port=cast(int, values.get("secure_port", 32443)),
            cert_dir=cert_dir,
        ),
        deviceplugin=DevicePluginSettings(
            kube_socket=cast(str, values["kube_socket"]),
            node_name=node,
            no_shared=bool(values.get("no_shared")),
            no_sliced=bool(values.get("no_sliced")),
            no_partitioned=bool(values.get("no_partitioned")),
        ),
        monitor_period_s=_seconds(values, "monitor_period", 15.0),
        resync_period_s=_seconds(values, "resync_period", 300.0),
        heartbeat_s=_seconds(values, "heartbeat_period", 30.0),
        health_quarantine_s=_seconds(values, "health_quarantine", 300.0),
    )


def _seconds(values: Mapping[str, object], name: str, default: float) -> float:
    """A duration flag, or ``default`` while the flag is not in the command table yet."""
    value = values.get(name)
    return float(cast(float, value)) if value is not None else default

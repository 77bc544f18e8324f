"""The worker-gateway's settings: one frozen object, built from its flags and the environment.

:func:`settings_from` is the only place the gateway reads either. Refusals (exit 2, one line):
``--worker-conn-mode=gpustack-api`` (not built), a readiness timeout above
``--kube-conn-timeout``, a scheme other than http/https, an HTTPS endpoint that would review
tokens without a cluster to review them with.
"""

from __future__ import annotations

import msgspec

from bus import identity
from bus import settings as bus_settings
from bus.settings import BusSettings
from controlplane.k8s import client
from kit import files
from kit.options import Options, SettingsError
from kit.serving import HttpsSettings, https_from

__all__ = ["GatewaySettings", "settings_from"]


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    bus: BusSettings
    unix_path: str | None
    """Serve plain HTTP on this socket (mode 0600); None: HTTPS per ``https``."""
    https: HttpsSettings
    kube: client.KubeSettings | None
    readiness_timeout_s: float = 30.0
    round_interval_s: float = 5.0
    """How often members are asked (a round starts this long after the last one began)."""
    settle_s: float = 0.5
    """How long a round waits for members not seen before, once every known one answered."""
    max_members: int = 1024
    forget_after_s: float = 24 * 3600.0
    """A member silent this long leaves the listing."""


def settings_from(options: Options) -> GatewaySettings:
    """Build the settings from parsed flags."""
    if options.text("worker-conn-mode") == "gpustack-api":
        raise SettingsError(
            "--worker-conn-mode=gpustack-api: reaching members through a GPUStack server's API "
            "is not built; use --worker-conn-mode=loopback (members answer over the bus, linked "
            "as NATS leaf nodes: docs/gateway.md)"
        )
    _scheme(options)
    options.integer("worker-conn-gpustack-api-port")  # validated by its bounds, unused here
    timeout = options.seconds("worker-readiness-check-timeout")
    kube_timeout = options.seconds("kube-conn-timeout")
    if timeout > kube_timeout:
        raise SettingsError(
            f"--worker-readiness-check-timeout ({timeout:g}s) must not exceed "
            f"--kube-conn-timeout ({kube_timeout:g}s)"
        )
    kubeconfig = options.optional_text("kubeconfig") or options.env.get("KUBECONFIG") or None
    kube = None
    if kubeconfig not in (None, "none"):
        _check_kubeconfig(kubeconfig)
    if kubeconfig != "none":
        kube = client.KubeSettings(
            kubeconfig=kubeconfig,
            qps=options.number("kube-conn-qps"),
            burst=options.integer("kube-conn-burst"),
            timeout_s=kube_timeout,
        )
    unix_path = options.optional_text("bind-unix-path")
    if unix_path is not None:
        try:
            files.socket_directory(unix_path)
        except files.InputRefused as e:
            raise SettingsError(f"--bind-unix-path: {e}") from e
    https = https_from(options)
    if unix_path is None and kube is None and https.auth == "review":
        raise SettingsError(
            "--metrics-auth=review needs the Kubernetes API to review tokens; with "
            "--kubeconfig=none serve on --bind-unix-path or pass --metrics-auth=none"
        )
    bus = bus_settings.from_options(options, state=False)
    return GatewaySettings(
        bus=msgspec.structs.replace(
            bus, inbox_prefix=identity.inbox_prefix(identity.Identity(role="gateway"))
        ),
        unix_path=unix_path,
        https=https,
        kube=kube,
        readiness_timeout_s=timeout,
    )


def _scheme(options: Options) -> str:
    scheme = options.optional_text("worker-conn-gpustack-api-scheme")
    if scheme is None:
        return "https" if options.integer("worker-conn-gpustack-api-port") == 443 else "http"
    if scheme not in ("http", "https"):
        raise SettingsError(f"--worker-conn-gpustack-api-scheme {scheme!r}: http or https")
    return scheme


def _check_kubeconfig(path: str) -> None:
    """A kubeconfig that is no regular file, or larger than any kubeconfig (the loader would
    read it whole), exits 2 at start-up.

    :raises SettingsError: naming ``--kubeconfig`` and the reason.
    """
    try:
        files.read_capped(path)
    except files.InputRefused as e:
        raise SettingsError(f"--kubeconfig (or KUBECONFIG): {e}") from e

"""The worker-gateway's settings: one frozen object, built from its flags and the environment.

:func:`settings_from` is the only place the gateway reads either. Refusals (exit 2, one line): a
readiness timeout above ``--kube-conn-timeout``, a scheme other than http/https, an HTTPS endpoint
that would review tokens without a cluster to review them with.

Two ways to reach a subscribed cluster (``--worker-conn-mode``):

- ``gpustack-api`` (the default): through the GPUStack server on this host,
  ``<scheme>://localhost:<port>/v2/clusters/<cluster>/proxy/<Kubernetes path>`` with the token
  the subscription carried; the scheme is https when the port is 443, else http, unless given;
- ``loopback``: every cluster is the one this process's kubeconfig (or in-cluster config) names;
  the subscription's cluster and token only label what is read.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from controlplane.k8s import client
from kit import files
from kit.httpsettings import HttpsSettings, ServingFlags, https_from
from kit.options import Flags, Options, SettingsError

__all__ = ["GatewaySettings", "Upstream", "settings_from"]

Mode = Literal["gpustack-api", "loopback"]


class Upstream(msgspec.Struct, frozen=True, kw_only=True):
    """How a cluster is reached: the GPUStack server's proxy, or one kubeconfig for all."""

    mode: Mode
    scheme: str = "http"
    port: int
    kube: client.KubeSettings | None = None
    """Loopback: the cluster every subscription reads."""
    timeout_s: float
    qps: float
    burst: int
    """``port``, ``timeout_s``, ``qps`` and ``burst`` have no default here: the command
    table's (``--worker-conn-gpustack-api-port``, ``--kube-conn-*``) is the one."""

    def base_url(self, cluster: str) -> str:
        """The proxy prefix every Kubernetes path of ``cluster`` goes under (gpustack-api)."""
        return f"{self.scheme}://localhost:{self.port}/v2/clusters/{cluster}/proxy"


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    upstream: Upstream
    unix_path: str | None
    """Serve HTTPS (a self-signed certificate) on this socket, mode 0600; None: per ``https``."""
    https: HttpsSettings
    kube: client.KubeSettings | None
    """The API that reviews tokens on the HTTPS port; None: none."""
    readiness_timeout_s: float
    """``--worker-readiness-check-timeout`` (its default is the command table's)."""
    readiness_poll_s: float = 2.0
    backoff_s: tuple[float, float] = (5.0, 60.0)
    """First and largest pause between readiness checks that failed."""
    relist_s: float
    """A subscribed kind is listed again this often (``--informer-cache-resync-period``)."""


class GatewayFlags(Flags, frozen=True, kw_only=True):
    """The flags of ``worker-gateway`` (its HTTPS endpoint's are :class:`ServingFlags`)."""

    kubeconfig: str
    kube_conn_qps: float
    kube_conn_burst: int
    kube_conn_timeout: float
    informer_cache_resync_period: float
    bind_unix_path: str
    worker_conn_mode: str
    worker_conn_gpustack_api_port: int
    worker_conn_gpustack_api_scheme: str
    worker_readiness_check_timeout: float


def settings_from(options: Options) -> GatewaySettings:
    """Build the settings from parsed flags."""
    flags = options.read_flags(GatewayFlags)
    timeout, kube_timeout = flags.worker_readiness_check_timeout, flags.kube_conn_timeout
    if timeout > kube_timeout:
        raise SettingsError(
            f"--worker-readiness-check-timeout ({timeout:g}s) must not exceed "
            f"--kube-conn-timeout ({kube_timeout:g}s)"
        )
    kubeconfig = client.kubeconfig_from(flags.kubeconfig, options.env)
    kube = None
    if kubeconfig != "none":
        kube = client.KubeSettings(
            kubeconfig=kubeconfig,
            qps=flags.kube_conn_qps,
            burst=flags.kube_conn_burst,
            timeout_s=kube_timeout,
            relist_s=flags.informer_cache_resync_period,
        )
    mode = flags.worker_conn_mode
    if mode == "loopback" and kube is None:
        raise SettingsError(
            "--worker-conn-mode=loopback reads the cluster of --kubeconfig; it cannot be 'none'"
        )
    upstream = Upstream(
        mode="loopback" if mode == "loopback" else "gpustack-api",
        scheme=_scheme(flags),
        port=flags.worker_conn_gpustack_api_port,
        kube=kube if mode == "loopback" else None,
        timeout_s=kube_timeout,
        qps=flags.kube_conn_qps,
        burst=flags.kube_conn_burst,
    )
    unix_path = flags.bind_unix_path or None
    if unix_path is not None:
        try:
            files.socket_directory(unix_path)
        except files.InputRefused as e:
            raise SettingsError(f"--bind-unix-path: {e}") from e
    https = https_from(options.read_flags(ServingFlags))
    if unix_path is None and kube is None and https.auth == "review":
        raise SettingsError(
            "--metrics-auth=review needs the Kubernetes API to review tokens; with "
            "--kubeconfig=none serve on --bind-unix-path or pass --metrics-auth=none"
        )
    return GatewaySettings(
        upstream=upstream,
        unix_path=unix_path,
        https=https,
        kube=kube,
        readiness_timeout_s=timeout,
        relist_s=flags.informer_cache_resync_period,
    )


def _scheme(flags: GatewayFlags) -> str:
    scheme = flags.worker_conn_gpustack_api_scheme
    if not scheme:
        return "https" if flags.worker_conn_gpustack_api_port == 443 else "http"
    if scheme not in ("http", "https"):
        raise SettingsError(f"--worker-conn-gpustack-api-scheme {scheme!r}: http or https")
    return scheme

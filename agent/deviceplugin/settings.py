"""Settings of the device-plugin servers: built once at the command edge, then passed down."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.deviceplugin.cdi import Strategy


@dataclass(frozen=True)
class DevicePluginSettings:
    kube_socket: str
    """Path of ``kubelet.sock``; our sockets live in its directory as ``<mfr>.<mode>.sock``."""
    node_name: str
    """The Kubernetes node name, stamped on every published allocation event."""
    no_shared: bool
    no_sliced: bool
    no_partitioned: bool
    """``--no-shared``/``--no-sliced``/``--no-partitioned``: no default here, the command table's
    is the one (the builder, or a test's :meth:`for_tests`, says each)."""
    host_lib_dir: str = "/var/lib/gpustack/operator/lib"
    """Host directory holding the preload libraries sliced containers get mounted."""
    host_work_dir: str = "/var/lib/gpustack/operator/pods"
    """Host directory of the per-allocation work directories (HAMi-core's ``/tmp/vgpu``). The
    plugin creates and removes them itself, so its container must mount this host path at the
    same path."""
    pod_resources_socket: str | None = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """kubelet's pod-resources socket; None skips asking kubelet who holds what."""
    register_retry_s: float = 1.0
    """Seconds between Register attempts while kubelet is absent or refuses, and between the
    level checks (our sockets present, kubelet.sock unchanged) that back up inotify."""
    shutdown_timeout_s: float = 2.0
    """Seconds cleanup (closing servers, removing sockets) may take when cancelled."""
    pod_resources_period_s: float = 30.0
    """Seconds between pod-resources resyncs (one also follows every Allocate)."""
    release_grace_s: float = 60.0
    """An allocation younger than this is never released for being absent from pod-resources:
    kubelet records a container's devices only after Allocate returns."""
    register_timeout_s: float = 5.0
    """Deadline of one Register call."""
    partition_resync_s: float = 10.0
    """Seconds between MIG reclaim passes (one also follows every release)."""
    partition_orphan_debounce_s: float = 60.0
    """A MIG instance no allocation accounts for is destroyed once unaccounted this long."""
    partition_destroy_attempts: int = 5
    """Tries to destroy a MIG instance that answers IN_USE, per reclaim pass."""
    partition_destroy_backoff_s: float = 0.2
    """Seconds between those tries."""
    nvidia_injection: Strategy = "envvar"
    """How NVIDIA cards reach a container: ``NVIDIA_VISIBLE_DEVICES``, CDI annotations, or CDI
    where the node's specs name every granted card (:mod:`agent.deviceplugin.cdi`)."""
    cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
    """Where the CDI specs are read from (never written)."""
    cdi_refresh_s: float = 30.0
    """How often the specs are read again (``nvidia-ctk cdi generate`` may run after start)."""
    pending_wait_s: float = 3.0
    """How long a partitioned Allocate waits for the worker's pending record naming its
    container (the record follows the Pod's binding by about a second)."""

    @property
    def socket_dir(self) -> str:
        return os.path.dirname(self.kube_socket) or "."

    @classmethod
    def for_tests(cls, directory: str, **kw: Any) -> DevicePluginSettings:
        """Settings for a fake kubelet in ``directory``: every mode served, short retries, no
        pod-resources, work directories under ``directory``."""
        base = cls(
            kube_socket=os.path.join(directory, "kubelet.sock"),
            node_name="test-node",
            no_shared=False,
            no_sliced=False,
            no_partitioned=False,
            pod_resources_socket=None,
            host_work_dir=os.path.join(directory, "pods"),
            register_retry_s=0.1,
            shutdown_timeout_s=2.0,
            register_timeout_s=2.0,
            partition_resync_s=0.2,
            partition_destroy_backoff_s=0.01,
            pending_wait_s=0.3,
        )
        return replace(base, **kw)

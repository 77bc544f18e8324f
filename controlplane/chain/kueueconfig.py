"""Kueue's configuration for the chain (``deploy/overlays/kueue``; a test keeps them in sync).

What the chain needs from Kueue beyond its defaults:

- ``resources.transformations``: every accelerator request becomes credits of its
  manufacturer, ``credits.gpustack.ai/<mfr>``, one card = 1,600,000 credits, so one quota
  governs all four families: a whole card ``<base>`` is 1,600,000 credits, a share
  ``<base>.shared`` 160,000, and the derived units ``<base>.sliced.units`` and
  ``<base>.partitioned.units`` (written by the Pod webhook) one credit each. ``Replace``: the
  inputs themselves are not quota (the ClusterQueues cover credits only);
- ``resources.quotaCheckStrategy: IgnoreUndeclared``: resources a ClusterQueue does not cover
  (``cpu`` on an accelerated queue, the ``.sliced`` and ``.partitioned`` tokens, memory) are not
  checked against quota;
- the ``pod`` integration (Pods join by ``kueue.x-k8s.io/queue-name``). Topology-aware scheduling
  (the flavors' ``topologyName``) is on by default from Kueue v0.14 (beta).
"""

from __future__ import annotations

from typing import Any, Final

from controlplane.chain import naming
from controlplane.families import BASES
from controlplane.reconciling.allocating import SHARES, UNITS

__all__ = ["CONFIG_KEY", "CONFIG_MAP", "configuration", "transformations"]

CONFIG_MAP: Final = "kueue-manager-config"
CONFIG_KEY: Final = "controller_manager_config.yaml"
KUEUE_NAMESPACE: Final = "kueue-system"


def transformations() -> list[dict[str, Any]]:
    """Accelerator requests to credits, per manufacturer (sorted by manufacturer)."""
    out: list[dict[str, Any]] = []
    for manufacturer, base in sorted(BASES.items()):
        credits = naming.credits(manufacturer)
        for suffix, per_unit in (
            ("", UNITS), (".shared", UNITS // SHARES), (".sliced.units", 1),
            (".partitioned.units", 1),
        ):  # fmt: skip
            out.append({
                "input": f"{base}{suffix}", "strategy": "Replace",
                "outputs": {credits: naming.quantity(per_unit)},
            })  # fmt: skip
    return out


def configuration() -> dict[str, Any]:
    """The ``Configuration`` (config.kueue.x-k8s.io/v1beta2) the overlay ships."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job", "pod", "deployment", "statefulset"]},
        "resources": {
            "quotaCheckStrategy": "IgnoreUndeclared",
            "transformations": transformations(),
        },
    }

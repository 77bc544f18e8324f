"""The bundled applications the worker manages (``--disable-applications`` turns them off).

In this project "installing" an application means the worker ensures, at start-up and with
server-side apply, the cluster objects of that application it owns; the Deployments and
DaemonSets themselves come from the kustomize tree (``deploy/``), which is why the shipped worker
runs with ``--disable-applications=*``. What each application means to the worker:

- ``model-manager``: the ``CSIDriver`` ``model.csi.gpustack.ai`` (ephemeral inline volumes,
  pod info on mount, no attach);
- ``kueue``: the Kueue scheduling chain the worker materializes (``manage_kueue`` of the chain's
  settings, :func:`controlplane.settingscatalog.chain_fields`);
- ``device-manager``, ``node-feature-discovery``, ``csi-driver-nfs``, ``csi-driver-s3``: nothing
  the worker creates in this build (their objects come from ``deploy/`` or from their own
  charts); naming them is accepted so the reference's command lines keep working.

CRDs, the webhook configurations, the APIService and the Settings are not applications: the
worker always ensures them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final

from controlplane.k8s.client import KubeClient
from controlplane.resources import Ref, Resource

__all__ = ["CSIDRIVERS", "NAMES", "csi_driver", "enabled", "ensure"]

log = logging.getLogger(__name__)

NAMES: Final = (
    "kueue",
    "node-feature-discovery",
    "csi-driver-nfs",
    "csi-driver-s3",
    "device-manager",
    "model-manager",
)
CSIDRIVERS: Final = Resource(
    group="storage.k8s.io", version="v1", plural="csidrivers", kind="CSIDriver"
)
DRIVER: Final = "model.csi.gpustack.ai"


def enabled(disabled: Iterable[str]) -> frozenset[str]:
    """The applications left on. :raises ValueError: an unknown name (``*`` disables all)."""
    names = [d.strip() for d in disabled if d.strip()]
    if "*" in names:
        return frozenset()
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown application(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return frozenset(NAMES) - set(names)


def csi_driver() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {
            "name": DRIVER,
            "labels": {"app.kubernetes.io/part-of": "gpustack-operator"},
        },
        "spec": {
            "attachRequired": False,
            "podInfoOnMount": True,
            "volumeLifecycleModes": ["Ephemeral"],
            "fsGroupPolicy": "None",
        },
    }


async def ensure(api: KubeClient, applications: frozenset[str]) -> None:
    """Apply the objects of every enabled application (idempotent)."""
    if "model-manager" in applications:
        await api.apply(Ref(resource=CSIDRIVERS, name=DRIVER), csi_driver())
        log.info("application model-manager: CSIDriver %s ensured", DRIVER)

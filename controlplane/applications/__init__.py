"""The bundled applications the worker installs (``--disable-applications`` turns them off).

Two kinds:

- **upstream** (``kueue``, ``node-feature-discovery``, ``csi-driver-nfs``, ``csi-driver-s3``):
  a pinned release (:data:`.pins.PINS`: version, manifest URL, SHA-256) fetched from upstream or
  read from a mirror (``--applications-mirror``), refused unless it hashes to the pin,
  configured as this system needs (:mod:`.configuring`; :mod:`.manifests` fetches and checks
  it) and applied with server-side apply;
- **own** (``model-manager``, ``device-manager``): objects of this project the worker renders
  itself (:data:`OWN`): the model agent's ``CSIDriver``. The agents' DaemonSets come from
  ``deploy/`` (``kubectl apply -k``), so ``device-manager`` has no object of its own here.

Each application's objects are applied under its own field manager and labelled with its name;
an application disabled later has the objects it installed pruned (:mod:`.planning` decides,
:mod:`.installing` does the I/O). Only the leader installs (``controlplane.worker.running``).

CRDs, the webhook configurations, the APIService and the Settings are not applications: the
worker always ensures them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from controlplane.applications.installing import Own, keep_installed
from controlplane.applications.pins import PINS
from controlplane.k8s.client import KubeClient
from controlplane.resources import Resource

__all__ = ["CSIDRIVERS", "NAMES", "OWN", "csi_driver", "enabled", "ensure"]

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


OWN: Final[dict[str, Own]] = {"model-manager": lambda: [csi_driver()]}
"""``device-manager`` is in neither table: its outcome is ``external``."""


async def ensure(
    api: KubeClient, applications: frozenset[str], *, namespace: str, mirror: str | None = None
) -> None:
    """Install the enabled applications and prune the disabled ones (the leader; returns once
    nothing is left to retry)."""
    await keep_installed(api, applications, namespace=namespace, pins=PINS, own=OWN, mirror=mirror)

"""The bundled applications the worker installs (``--disable-applications`` turns them off).

Two kinds:

- **upstream** (``kueue``, ``node-feature-discovery``, ``csi-driver-nfs``, ``csi-driver-s3``):
  a pinned release (:data:`.pins.PINS`: version, manifest URL, SHA-256) fetched from upstream or
  read from a mirror (``--applications-mirror``), refused unless it hashes to the pin,
  configured as this system needs (:mod:`.configuring`; :mod:`.manifests` fetches and checks
  it) and applied with server-side apply;
- **own** (``model-manager``, ``device-manager``): the node agents, rendered by the worker from
  the very files ``deploy/base`` holds (:mod:`.agents`), with the worker's own image.

Each application's objects are applied under its own field manager and labelled with its name;
an application disabled later has the objects it installed pruned (:mod:`.planning` decides,
:mod:`.installing` does the I/O). Only the leader installs (``controlplane.worker.running``).

CRDs, the webhook configurations, the APIService and the Settings are not applications: the
worker always ensures them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final

from controlplane.applications import agents
from controlplane.applications.installing import Catalog, Own, keep_installed
from controlplane.applications.pins import PINS
from controlplane.k8s.client import KubeClient

__all__ = ["DRIVER", "NAMES", "enabled", "ensure", "own"]

NAMES: Final = (
    "kueue",
    "node-feature-discovery",
    "csi-driver-nfs",
    "csi-driver-s3",
    "device-manager",
    "model-manager",
)
DRIVER: Final = "model.csi.gpustack.ai"
"""The model agent's CSI driver (its ``CSIDriver`` is part of ``model-manager``)."""


def enabled(disabled: Iterable[str]) -> frozenset[str]:
    """The applications left on. :raises ValueError: an unknown name (``*`` disables all)."""
    names = [d.strip() for d in disabled if d.strip()]
    if "*" in names:
        return frozenset()
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown application(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return frozenset(NAMES) - set(names)


def own(image: str, manufacturers: tuple[str, ...] = ()) -> dict[str, Own]:
    """The agent applications' renderers, for the worker running ``image``."""
    return {
        app: functools.partial(agents.render, app, image=image, manufacturers=manufacturers)
        for app in agents.FILES
    }


async def ensure(
    api: KubeClient,
    applications: frozenset[str],
    *,
    namespace: str,
    mirror: str | None = None,
    pod: str | None = None,
    manufacturers: tuple[str, ...] = (),
) -> None:
    """Install the enabled applications and prune the disabled ones (the leader; returns once
    nothing is left to retry). ``pod``: the worker's own Pod, whose image the agents run."""
    image = await agents.own_image(api, namespace, pod) if applications & set(agents.FILES) else ""
    catalog = Catalog(namespace=namespace, pins=PINS, own=own(image, manufacturers), mirror=mirror)
    await keep_installed(api, applications, catalog)

"""The node agents as applications: ``device-manager`` (one DaemonSet per manufacturer) and
``model-manager`` (the CSI node plugin's DaemonSet and its CSIDriver), rendered by the worker.

One source: ``bundled/*.yaml`` are symbolic links to the files of ``deploy/base`` (a wheel, and
so the image, holds their contents), so what the worker applies and what
``kubectl apply -k deploy/base`` applies are the same objects, and cannot drift apart. Rendering
(pure) changes two things only:

- the operator image, untagged in the files (kustomize's ``images`` sets the tag), becomes the
  image the worker itself runs, so the agents always run the worker's release (and registry);
- with ``--manufacturer``, the DaemonSets of the other manufacturers are left out (and so
  pruned), as the worker manages no objects for them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib import resources
from typing import Any, Final

import yaml

from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.resources import PODS, Ref
from kit.version import package_version

__all__ = ["FILES", "IMAGE", "image_of", "own_image", "render"]

log = logging.getLogger(__name__)

IMAGE: Final = "gpustack/gpustack-operator"
"""The operator's image as the files name it (no tag: kustomize sets it)."""
MANUFACTURER: Final = "gpustack.ai/manufacturer"
"""The label naming a device agent DaemonSet's manufacturer."""
_VENDORS: Final = ("ascend", "cambricon", "hygon", "iluvatar", "metax", "mthreads", "thead")
FILES: Final[dict[str, tuple[str, ...]]] = {
    "device-manager": ("device-manager.yaml", *(f"device-manager-{v}.yaml" for v in _VENDORS)),
    "model-manager": ("model-manager.yaml",),
}
"""Each agent application's files under ``bundled/`` (links into ``deploy/base``)."""
CONTAINER: Final = "worker"
"""The worker's container in its Pod (``deploy/base/worker.yaml``)."""


def _documents(file: str) -> list[dict[str, Any]]:
    text = (resources.files(__package__) / "bundled" / file).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _containers(obj: dict[str, Any]) -> Iterable[dict[str, Any]]:
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    yield from spec.get("initContainers") or ()
    yield from spec.get("containers") or ()


def _wanted(obj: dict[str, Any], manufacturers: tuple[str, ...]) -> bool:
    if not manufacturers or obj["kind"] != "DaemonSet":
        return True
    label = (obj["metadata"].get("labels") or {}).get(MANUFACTURER)
    return label is None or label in manufacturers


def render(app: str, *, image: str, manufacturers: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """``app``'s objects as the worker applies them (fresh copies; ``manufacturers`` empty:
    all). :raises KeyError: not an agent application."""
    out: list[dict[str, Any]] = []
    for file in FILES[app]:
        for obj in _documents(file):
            if not _wanted(obj, manufacturers):
                continue
            for container in _containers(obj):
                if container.get("image") == IMAGE:
                    container["image"] = image
            out.append(obj)
    return out


def image_of(pod: dict[str, Any]) -> str | None:
    """The image of the worker's container in its Pod (pure); None: no such container."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        if container.get("name") == CONTAINER and container.get("image"):
            return str(container["image"])
    return None


def default_image() -> str:
    return f"{IMAGE}:{package_version()}"


async def own_image(api: KubeClient, namespace: str, pod: str | None) -> str:
    """The image the worker runs, read from its own Pod (``KUBERNETES_POD_NAME``); the release's
    image (``gpustack/gpustack-operator:<version>``) when the Pod is unknown or unreadable."""
    if pod:
        try:
            found = image_of(await api.get(Ref(resource=PODS, name=pod, namespace=namespace)))
        except errors.ApiError as e:
            log.warning("reading this worker's Pod %s failed (%s); agents get %s", pod, e,
                        default_image())  # fmt: skip
        else:
            if found:
                return found
    return default_image()

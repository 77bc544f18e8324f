"""What this system changes in an upstream manifest before applying it (pure).

- every object is labelled ``applications.gpustack.ai/name=<application>`` and
  ``app.kubernetes.io/managed-by=gpustack-operator``: pruning deletes only objects carrying the
  label of the application being pruned;
- Node Feature Discovery's worker configuration (the ConfigMap ``nfd-worker-conf``) gets
  ``sources.pci.deviceLabelFields: [vendor]``, so nodes carry
  ``feature.node.kubernetes.io/pci-<vendor>.present``, the label the device agents' DaemonSets
  select on (NFD's default also puts the PCI class in the name);
- Kueue's manager configuration (the ConfigMap ``kueue-manager-config``) becomes the one the
  scheduling chain needs (:func:`controlplane.chain.kueueconfig.configuration`).

A manifest that lacks the object to configure is refused (:class:`ManifestError`): applying it
unconfigured would install an application the chain cannot use.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Final

import yaml

from controlplane.applications.manifests import ManifestError
from controlplane.chain import kueueconfig

__all__ = ["LABEL", "MANAGED_BY", "configure"]

LABEL: Final = "applications.gpustack.ai/name"
VERSION_ANNOTATION: Final = "applications.gpustack.ai/version"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "gpustack-operator"}
NFD_CONFIG: Final = ("nfd-worker-conf", "nfd-worker.conf")


def _config_map(objects: list[dict[str, Any]], name: str, key: str, app: str) -> dict[str, Any]:
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].endswith(name):
            data = obj.setdefault("data", {})
            if key in data or not data:
                return data  # type: ignore[no-any-return]
    raise ManifestError("invalid", f"{app}: the manifest has no ConfigMap {name} ({key})")


def _nfd(objects: list[dict[str, Any]]) -> None:
    name, key = NFD_CONFIG
    data = _config_map(objects, name, key, "node-feature-discovery")
    config = yaml.safe_load(data.get(key) or "") or {}
    if not isinstance(config, dict):
        raise ManifestError("invalid", f"node-feature-discovery: {key} is not a mapping")
    pci = config.setdefault("sources", {}).setdefault("pci", {})
    pci["deviceLabelFields"] = ["vendor"]
    data[key] = yaml.safe_dump(config, sort_keys=True)


def _kueue(objects: list[dict[str, Any]]) -> None:
    data = _config_map(objects, kueueconfig.CONFIG_MAP, kueueconfig.CONFIG_KEY, "kueue")
    data[kueueconfig.CONFIG_KEY] = yaml.safe_dump(kueueconfig.configuration(), sort_keys=False)


CONFIGURE: Final[dict[str, Callable[[list[dict[str, Any]]], None]]] = {
    "node-feature-discovery": _nfd,
    "kueue": _kueue,
}


def configure(app: str, version: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``objects`` labelled as ``app``'s and configured as this system needs."""
    out = copy.deepcopy(objects)
    if app in CONFIGURE:
        CONFIGURE[app](out)
    for obj in out:
        meta = obj["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), **MANAGED_BY, LABEL: app}
        meta["annotations"] = {**(meta.get("annotations") or {}), VERSION_ANNOTATION: version}
    return out

"""What ``worker.gpustack.ai/v1`` serves, declared for the API-serving core: pure data.

Each resource is the v1 view of a stored ``v1alpha1`` object: the same body with
``apiVersion: worker.gpustack.ai/v1`` (:func:`view`), described by the same schema as its CRD
(:func:`controlplane.schema.crds.definitions`), so OpenAPI, ``kubectl explain`` and the stored objects
agree. Verbs follow the reference: reads everywhere, ``delete`` of ``nodemodelstores`` (the
stored object is deleted); ``modelartifacts`` carry the ``progress`` subresource, computed per
request.

Printer columns (the core adds ``Age``): the reference's where it lists them (NodeModelStore:
Ready, Used, Models, Downloading; InstanceType: ``ACCELERATOR(EX/SH/SL/PT)``, the
``onceMaxRequest/remaining`` pairs the chain writes into ``status.summary``), the CRDs' own
elsewhere; ``-o wide`` adds the ``priority: 1`` ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from controlplane.extension.core.model import GroupVersion, ResourceSpec, Subresource
from controlplane.extension.core.tables import Column
from controlplane.schema import crds

__all__ = ["GROUP", "GROUP_VERSION", "SPEC", "VERSION", "view"]

GROUP: Final = "worker.gpustack.ai"
VERSION: Final = "v1"
GROUP_VERSION: Final = f"{GROUP}/{VERSION}"
READ: Final = ("get", "list", "watch")


def _c(name: str, path: str, text: str, kind: str = "string", priority: int = 0) -> Column:
    return Column(name=name, type=kind, json_path=path, description=text, priority=priority)


def _schema(plural: str) -> dict[str, Any]:
    version = crds.definitions()[plural]["spec"]["versions"][0]
    return dict(version["schema"]["openAPIV3Schema"])


_PROGRESS_SCHEMA: Final = {
    "type": "object",
    "description": "How far the nodes got with one ModelArtifact, computed per request.",
    "properties": {
        "timestamp": {"type": "string", "format": "date-time"},
        "manifestDigest": {"type": "string"},
        "sizeBytes": {"type": "integer"},
        "ready": {"type": "integer"},
        "downloading": {"type": "integer"},
        "failed": {"type": "integer"},
        "downloadingBytes": {"type": "integer"},
        "downloadingPercent": {"type": "integer"},
        "live": {"type": "integer"},
        "failureReasons": {"type": "array", "items": {"type": "object", "properties": {
            "reason": {"type": "string"}, "count": {"type": "integer"}}}},
    },
}  # fmt: skip


def _spec() -> GroupVersion:
    return GroupVersion(group=GROUP, version=VERSION, resources=(
        ResourceSpec(
            plural="devices", singular="devices", kind="Devices", namespaced=False,
            verbs=READ, schema=_schema("devices"), short=("devs",),
            categories=("gpustack",),
            columns=(
                _c("Product", ".spec.groups[0].name", "the first group's product"),
                _c("Accelerators", ".status.summary.accelerators", "on the node", "integer"),
                _c("Memory", ".status.summary.memory", "VRAM in all"),
                _c("Unhealthy", ".status.summary.unhealthy", "unhealthy ones", "integer"),
                _c("Allocated", ".status.summary.allocated", "with an allocation", "integer"),
                _c("Driver", ".spec.groups[0].driverVersion", "the first group's driver",
                   priority=1),
            ),
        ),
        ResourceSpec(
            plural="nodemodelstores", singular="nodemodelstore", kind="NodeModelStore",
            namespaced=False, verbs=(*READ, "delete"), schema=_schema("nodemodelstores"),
            short=("nms",), categories=("gpustack",),
            columns=(
                _c("Ready", '.status.conditions[?(@.type=="Ready")].status', "the cache serves"),
                _c("Used", ".status.capacity.usedPercent", "percent of capacity used",
                   "integer"),
                _c("Models", ".status.modelCounts.ready", "models ready", "integer"),
                _c("Downloading", ".status.modelCounts.downloading", "models downloading",
                   "integer"),
            ),
        ),
        ResourceSpec(
            plural="modelartifacts", singular="modelartifact", kind="ModelArtifact",
            namespaced=True, verbs=READ, schema=_schema("modelartifacts"), short=("mart",),
            categories=("gpustack",),
            subresources=(Subresource(name="progress", kind="ModelArtifactProgress",
                                      schema=_PROGRESS_SCHEMA),),
            columns=(
                _c("Repository", ".spec.source.huggingFace.repository", "the repository"),
                _c("Resolved", '.status.conditions[?(@.type=="Resolved")].status',
                   "revision and digest known"),
                _c("Ready", ".status.nodes.ready", "nodes holding it", "integer"),
                _c("Downloading", ".status.nodes.downloading", "nodes downloading it", "integer"),
                _c("ModelScope", ".spec.source.modelScope.repository",
                   "the ModelScope repository", priority=1),
                _c("Digest", ".status.resolved.manifestDigest", "the manifest digest",
                   priority=1),
            ),
        ),
        ResourceSpec(
            plural="instancetypes", singular="instancetype", kind="InstanceType",
            namespaced=False, verbs=READ, schema=_schema("instancetypes"), short=("instype",),
            categories=("gpustack",),
            columns=(
                _c("ACCELERATOR(EX/SH/SL/PT)", ".status.summary",
                   "onceMaxRequest/remaining: exclusive, shared, sliced, partitioned"),
                _c("ENTRANCE", ".status.entrance", "the LocalQueue Pods name"),
                _c("CAPACITY", ".status.accelerator.capacity", "whole cards in all", "integer",
                   priority=1),
                _c("PRODUCT", ".spec.product", "the accelerator product", priority=1),
                _c("INACTIVE", ".spec.inactive", "its queue holds", "boolean", priority=1),
            ),
        ),
        ResourceSpec(
            plural="instancetypeflavors", singular="instancetypeflavor",
            kind="InstanceTypeFlavor", namespaced=False, verbs=READ,
            schema=_schema("instancetypeflavors"), short=("instypeflavor",),
            categories=("gpustack",),
            columns=(
                _c("Accelerator", ".spec.acceleratorGroup", "the accelerator group"),
                _c("Count", ".spec.count", "cards per node", "integer"),
                _c("Nodes", ".spec.nodes", "nodes of this flavor", "integer"),
            ),
        ),
    ))  # fmt: skip


SPEC: Final = _spec()
RESOURCES: Final[Mapping[str, ResourceSpec]] = {r.plural: r for r in SPEC.resources}


def view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The v1 view of a stored object: the same body under this group version."""
    return {**body, "apiVersion": GROUP_VERSION}

"""The CustomResourceDefinitions of ``worker.gpustack.ai/v1alpha1``, and applying them.

The definitions are data built here; ``deploy/crds/*.yaml`` are these dicts dumped (a test checks
they are in sync). The worker applies them at start-up with server-side apply (idempotent) and
re-applies any that disappear (:func:`keep_present`).

``Devices.spec.groups`` mirrors :mod:`bus.devices` field for field, so what ``dm detect`` prints
validates (a test checks it against a fixture produced by ``dm detect --simulate``).
"""

from __future__ import annotations

import logging
from typing import Any, Final

import anyio

from controlplane import errors
from controlplane.chain import schemas
from controlplane.k8s.client import KubeClient
from controlplane.resources import CRDS, GROUP, VERSION, Ref
from controlplane.schema import crddocs

__all__ = ["definitions", "ensure", "keep_present"]

log = logging.getLogger(__name__)

_S: Final = {"type": "string"}
_B: Final = {"type": "boolean"}


def _i(minimum: int | None = 0, maximum: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer"}
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return out


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    return out


def _list(items: dict[str, Any], *keys: str, max_items: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "array", "items": items}
    if keys:
        out["x-kubernetes-list-type"] = "map"
        out["x-kubernetes-list-map-keys"] = list(keys)
    if max_items:
        out["maxItems"] = max_items
    return out


_CONDITION: Final = _obj(
    {
        "type": _S,
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": _S,
        "message": _S,
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": _i(),
    },
    ("type", "status"),
)
_CONDITIONS: Final = _list(_CONDITION, "type")

_PROFILE: Final = _obj(
    {"name": _S, "memoryMib": _i(), "computeSlices": _i(), "memorySlices": _i(), "count": _i()},
    ("name", "memoryMib", "computeSlices", "memorySlices", "count"),
)
_ACCELERATOR: Final = _obj(
    {
        "id": {"type": "string", "minLength": 1},
        "index": _i(),
        "physicalIndexes": {"type": "array", "items": _i()},
        "topology": _obj(
            {
                "pciBusId": _S,
                "pciRootId": _S,
                "pciSwitches": {"type": "array", "items": _S},
                "numaAffinity": _S,
                "cpuAffinity": _S,
            }
        ),
        "status": _obj(
            {
                "unhealthy": _B,
                "logicalSliced": _obj(
                    {"coresPercentageOvercommit": _B, "count": _i()},
                    ("coresPercentageOvercommit", "count"),
                ),
                "physicalSliced": _obj({"profiles": _list(_PROFILE, "name"), "count": _i()}),
            },
            ("unhealthy",),
        ),
    },
    ("id", "index", "status"),
)
_GROUP: Final = _obj(
    {
        "id": {"type": "string", "minLength": 1},
        "manufacturer": {"type": "string", "minLength": 1},
        "name": _S,
        "memory": _i(),
        "cores": _i(),
        "driverVersion": _S,
        "runtimeVersion": _S,
        "computeCapability": _S,
        "family": _S,
        "simulated": _B,
        "accelerators": _list(_ACCELERATOR, "id"),
    },
    ("id", "manufacturer", "name"),
)
_ALLOCATION: Final = _obj(
    {
        "id": _S,
        "index": _i(),
        "mode": {
            "type": "string",
            "enum": ["None", "Exclusive", "Shared", "Sliced", "Partitioned"],
        },
        "allocated": _i(0, 1_600_000),
        "remaining": _i(0, 1_600_000),
        "allocatedSlices": _i(),
        "allocatedProfiles": _list(_obj({"name": _S, "count": _i()}, ("name", "count")), "name"),
        "remainingProfiles": _list(_obj({"name": _S, "count": _i()}, ("name", "count")), "name"),
    },
    ("id", "index", "mode", "allocated", "remaining"),
)
DEVICES_SCHEMA: Final = _obj(
    {
        "apiVersion": _S,
        "kind": _S,
        "metadata": {"type": "object"},
        "spec": _obj({"groups": _list(_GROUP, "id", "manufacturer")}),
        "status": _obj(
            {
                "groups": _list(
                    _obj(
                        {"id": _S, "manufacturer": _S, "accelerators": _list(_ALLOCATION, "id")},
                        ("id", "manufacturer"),
                    ),
                    "id",
                    "manufacturer",
                ),
                "summary": _obj(
                    {"accelerators": _i(), "unhealthy": _i(), "allocated": _i(), "memory": _S}
                ),
            }
        ),
    }
)

_MODEL: Final = _obj(
    {
        "digest": {"type": "string", "minLength": 1},
        "state": {"type": "string", "enum": ["Downloading", "Ready", "Failed"]},
        "sizeBytes": _i(),
        "downloadedBytes": _i(),
        "progress": _S,
        "referenced": _i(),
        "lastUsedTime": {"type": "string", "format": "date-time"},
        "reason": _S,
        "message": _S,
        "retryTime": {"type": "string", "format": "date-time"},
        "source": {"type": "string", "enum": ["Hub", "Peer"]},
    },
    ("digest", "state"),
)
NODEMODELSTORE_SCHEMA: Final = _obj(
    {
        "apiVersion": _S,
        "kind": _S,
        "metadata": {"type": "object"},
        "spec": _obj(
            {
                "watermarks": _obj(
                    {
                        "highPercent": {**_i(2, 95), "default": 80},
                        "lowPercent": {**_i(1, 94), "default": 70},
                    }
                ),
                "download": _obj(
                    {
                        "concurrency": {**_i(1, 64), "default": 8},
                        "bytesPerSecond": {**_i(0), "default": 0},
                        "peerSync": {"type": "boolean", "default": True},
                    }
                ),
                "hub": _obj(
                    {
                        "huggingFaceEndpoint": {
                            "type": "string",
                            "default": "https://huggingface.co",
                        },
                        "modelScopeEndpoint": {
                            "type": "string",
                            "default": "https://www.modelscope.cn",
                        },
                        "httpsProxy": _S,
                        "noProxy": _S,
                        "caBundleConfigMap": _S,
                    }
                ),
                "store": _S,
                "pinned": {
                    "type": "array",
                    "maxItems": 256,
                    "items": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
                },
            }
        ),
        "status": _obj(
            {
                "observedGeneration": _i(),
                "capacity": _obj(
                    {
                        "totalBytes": _i(),
                        "storedBytes": _i(),
                        "usedPercent": _i(0, 100),
                        "total": _S,
                        "stored": _S,
                    }
                ),
                "models": _list(_MODEL, "digest", max_items=256),
                "modelCounts": _obj({"ready": _i(), "downloading": _i(), "failed": _i()}),
                "downloading": _S,
                "conditions": _CONDITIONS,
            }
        ),
    }
)

_DIGEST: Final = {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}
SOURCE_RULE: Final = (
    "[has(self.huggingFace), has(self.modelScope), has(self.persistentVolumeClaim),"
    " has(self.image)]"
    ".filter(x, x).size() == 1"
)
"""CEL: a ModelArtifact's source is exactly one (each new source adds its ``has``)."""
_QUANTITY_RE: Final = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[kMGTPE]i?|m)?$"


def _hub(revision: str) -> dict[str, Any]:
    """A hub source: a repository at a revision (the hub's default branch), with a token."""
    return _obj(
        {
            "repository": {"type": "string", "minLength": 1, "maxLength": 256},
            "revision": {"type": "string", "maxLength": 255, "default": revision},
            "secretRef": _obj({"name": _S}, ("name",)),
        },
        ("repository",),
    )


_PATTERNS: Final = {
    "type": "array",
    "maxItems": 32,
    "items": {"type": "string", "minLength": 1, "maxLength": 256},
}
MODELARTIFACT_SCHEMA: Final = _obj(
    {
        "apiVersion": _S,
        "kind": _S,
        "metadata": {"type": "object"},
        "spec": {
            **_obj(
                {
                    "source": {
                        **_obj(
                            {
                                "persistentVolumeClaim": _obj(
                                    {
                                        "claimName": {"type": "string", "minLength": 1},
                                        "path": {"type": "string", "maxLength": 4096},
                                    },
                                    ("claimName",),
                                ),
                                "image": _obj(
                                    {
                                        "reference": {
                                            "type": "string",
                                            "minLength": 1,
                                            "maxLength": 1024,
                                        }
                                    },
                                    ("reference",),
                                ),
                                "huggingFace": _hub("main"),
                                "modelScope": _hub("master"),
                            }
                        ),
                        "minProperties": 1,
                        "maxProperties": 1,
                        "x-kubernetes-validations": [
                            {
                                "rule": SOURCE_RULE,
                                "message": "source names exactly one of its fields",
                            }
                        ],
                    },
                    "allowPatterns": _PATTERNS,
                    "ignorePatterns": _PATTERNS,
                    "expectedDigest": _DIGEST,
                },
                ("source",),
            ),
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "spec is immutable"}
            ],
        },
        "status": _obj(
            {
                "observedGeneration": _i(),
                "resolved": _obj(
                    {
                        "revision": _S,
                        "manifestDigest": _DIGEST,
                        "digestSource": {"type": "string", "enum": ["Hub", "Expected"]},
                        "fileCount": _i(),
                        "sizeBytes": _i(),
                        "resolvedTime": {"type": "string", "format": "date-time"},
                        "lastValidatedTime": {"type": "string", "format": "date-time"},
                    }
                ),
                "nodes": _obj({"ready": _i(), "downloading": _i(), "failed": _i()}),
                "conditions": _CONDITIONS,
            }
        ),
    },
    ("spec",),
)

_SELECTOR: Final = _obj(
    {
        "matchLabels": {"type": "object", "additionalProperties": _S},
        "matchExpressions": {
            "type": "array",
            "items": _obj(
                {
                    "key": _S,
                    "operator": {
                        "type": "string",
                        "enum": ["In", "NotIn", "Exists", "DoesNotExist"],
                    },
                    "values": {"type": "array", "items": _S},
                },
                ("key", "operator"),
            ),
        },
    }
)
MODELSTORE_SCHEMA: Final = _obj(
    {
        "apiVersion": _S,
        "kind": _S,
        "metadata": {"type": "object"},
        "spec": _obj(
            {
                "nodeSelector": _SELECTOR,
                "watermarks": _obj({"highPercent": _i(2, 95), "lowPercent": _i(1, 94)}),
                "download": _obj({"concurrency": _i(1, 64), "bytesPerSecond": _i(0)}),
            },
            ("nodeSelector",),
        ),
        "status": _obj({"nodes": _i(), "conditions": _CONDITIONS}),
    },
    ("spec",),
)

_QUANTITY: Final = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": _QUANTITY_RE}],
}
_NAME_REF: Final = _obj({"name": {"type": "string", "minLength": 1}}, ("name",))
MODELSTOREBINDING_SCHEMA: Final = _obj(
    {
        "apiVersion": _S,
        "kind": _S,
        "metadata": {"type": "object"},
        "spec": _obj(
            {
                "storeRefs": {
                    **_list(_NAME_REF, "name", max_items=8),
                    "minItems": 1,
                    "x-kubernetes-validations": [
                        {"rule": "self == oldSelf", "message": "storeRefs is immutable"}
                    ],
                },
                "quota": _obj({"bytes": _QUANTITY}),
                "allowPinned": _B,
            },
            ("storeRefs",),
        ),
        "status": _obj(
            {
                "observedGeneration": _i(),
                "phase": {"type": "string", "enum": ["Ready", "OverQuota", "Error"]},
                "phaseMessage": _S,
                "usedBytes": _i(),
                "used": _S,
                "conditions": _CONDITIONS,
            }
        ),
    },
    ("spec",),
)
MODELPREFETCH_SCHEMA: Final = _obj(
    {
        "apiVersion": _S,
        "kind": _S,
        "metadata": {"type": "object"},
        "spec": _obj(
            {
                "artifactRef": _NAME_REF,
                "bindingRef": _NAME_REF,
                "placement": {
                    **_obj(
                        {
                            "instanceTypes": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": 8,
                                "items": {"type": "string", "minLength": 1},
                            },
                            "nodeSelector": _SELECTOR,
                        }
                    ),
                    "x-kubernetes-validations": [
                        {
                            "rule": "!(has(self.instanceTypes) && has(self.nodeSelector))",
                            "message": "placement takes instanceTypes or nodeSelector, not both",
                        }
                    ],
                },
                "minReady": {**_i(0), "default": 0},
                "retention": _obj({"pinned": _B, "ttlAfterLastUse": _S}),
            },
            ("artifactRef", "bindingRef"),
        ),
        "status": _obj(
            {
                "observedGeneration": _i(),
                "desiredNodes": _i(),
                "readyNodes": _i(),
                "downloadingNodes": _i(),
                "conditions": _CONDITIONS,
            }
        ),
    },
    ("spec",),
)


def _col(name: str, path: str, kind: str = "string", priority: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        out["priority"] = priority
    return out


def _crd(
    kind: str,
    plural: str,
    schema: dict[str, Any],
    *,
    scope: str,
    short: list[str],
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": ["gpustack"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": crddocs.describe(kind, schema)},
                    "additionalPrinterColumns": [
                        *columns,
                        _col("Age", ".metadata.creationTimestamp", "date"),
                    ],
                }
            ],
        },
    }


def definitions() -> dict[str, dict[str, Any]]:
    """Every CRD, keyed by file stem (``devices``, ``nodemodelstores``, ``modelartifacts``,
    ``instancetypes``, ``instancetypeflavors``, ``modelstores``, ``modelstorebindings``,
    ``modelprefetches``)."""
    return {
        "devices": _crd(
            "Devices",
            "devices",
            DEVICES_SCHEMA,
            scope="Cluster",
            short=["devs"],
            columns=[
                _col("Product", ".spec.groups[0].name"),
                _col("Accelerators", ".status.summary.accelerators", "integer"),
                _col("Memory", ".status.summary.memory"),
                _col("Unhealthy", ".status.summary.unhealthy", "integer"),
                _col("Allocated", ".status.summary.allocated", "integer"),
                _col("Driver", ".spec.groups[0].driverVersion", priority=1),
                _col(
                    "UnhealthyIDs",
                    ".spec.groups[*].accelerators[?(@.status.unhealthy==true)].id",
                    priority=1,
                ),
            ],
        ),
        "nodemodelstores": _crd(
            "NodeModelStore",
            "nodemodelstores",
            NODEMODELSTORE_SCHEMA,
            scope="Cluster",
            short=["nms"],
            columns=[
                _col("Ready", '.status.conditions[?(@.type=="Ready")].status'),
                _col("ModelsReady", ".status.modelCounts.ready", "integer"),
                _col("Downloading", ".status.modelCounts.downloading", "integer"),
                _col("Failed", ".status.modelCounts.failed", "integer"),
                _col("Stored", ".status.capacity.stored"),
                _col("Used%", ".status.capacity.usedPercent", "integer"),
                _col("CapacityLow", '.status.conditions[?(@.type=="CapacityLow")].status'),
                _col("Progress", ".status.downloading"),
                _col("Total", ".status.capacity.total", priority=1),
            ],
        ),
        "modelartifacts": _crd(
            "ModelArtifact",
            "modelartifacts",
            MODELARTIFACT_SCHEMA,
            scope="Namespaced",
            short=["mart"],
            columns=[
                _col("Repository", ".spec.source.huggingFace.repository"),
                _col("Resolved", '.status.conditions[?(@.type=="Resolved")].status'),
                _col("Ready", ".status.nodes.ready", "integer"),
                _col("ModelScope", ".spec.source.modelScope.repository", priority=1),
                _col("Digest", ".status.resolved.manifestDigest", priority=1),
            ],
        ),
        "instancetypes": _crd(
            "InstanceType",
            "instancetypes",
            schemas.INSTANCETYPE_SCHEMA,
            scope="Cluster",
            short=["instype"],
            columns=[_col(name, path) for name, path in schemas.INSTANCETYPE_COLUMNS],
        ),
        "instancetypeflavors": _crd(
            "InstanceTypeFlavor",
            "instancetypeflavors",
            schemas.INSTANCETYPEFLAVOR_SCHEMA,
            scope="Cluster",
            short=["instypeflavor"],
            columns=[
                _col("Accelerator", ".spec.acceleratorGroup"),
                _col("Count", ".spec.count", "integer"),
                _col("Nodes", ".spec.nodes", "integer"),
            ],
        ),
        "modelstores": _crd(
            "ModelStore",
            "modelstores",
            MODELSTORE_SCHEMA,
            scope="Cluster",
            short=["ms"],
            columns=[
                _col("Nodes", ".status.nodes", "integer"),
                _col("Ready", '.status.conditions[?(@.type=="Ready")].status'),
                _col("Overlap", '.status.conditions[?(@.type=="SelectorOverlap")].status'),
            ],
        ),
        "modelstorebindings": _crd(
            "ModelStoreBinding",
            "modelstorebindings",
            MODELSTOREBINDING_SCHEMA,
            scope="Namespaced",
            short=["msb"],
            columns=[
                _col("Phase", ".status.phase"),
                _col("Quota", ".spec.quota.bytes"),
                _col("Used", ".status.used"),
                _col("Stores", ".spec.storeRefs[*].name", priority=1),
            ],
        ),
        "modelprefetches": _crd(
            "ModelPrefetch",
            "modelprefetches",
            MODELPREFETCH_SCHEMA,
            scope="Namespaced",
            short=["mpf"],
            columns=[
                _col("Artifact", ".spec.artifactRef.name"),
                _col("Desired", ".status.desiredNodes", "integer"),
                _col("Ready", ".status.readyNodes", "integer"),
                _col("Downloading", ".status.downloadingNodes", "integer"),
                _col("Available", '.status.conditions[?(@.type=="Available")].status'),
                _col("Binding", ".spec.bindingRef.name", priority=1),
            ],
        ),
    }


async def ensure(client: KubeClient) -> None:
    """Apply every CRD (server-side apply; idempotent).

    :raises controlplane.errors.ApiError: the API refused one.
    """
    for crd in definitions().values():
        await client.apply(Ref(resource=CRDS, name=crd["metadata"]["name"]), crd)


async def keep_present(client: KubeClient, period_s: float) -> None:
    """Re-apply absent CRDs every ``period_s`` (never re-aligns ones that exist)."""
    while True:
        await anyio.sleep(period_s)
        for crd in definitions().values():
            ref = Ref(resource=CRDS, name=crd["metadata"]["name"])
            try:
                await client.get(ref)
            except errors.NotFound:
                log.warning("CRD %s is gone; applying it again", ref.name)
                await client.apply(ref, crd)
            except errors.ApiError as e:
                log.warning("checking CRD %s failed: %s", ref.name, e)

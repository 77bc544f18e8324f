"""Kueue's kinds as the fake API validates them: JSON Schemas written from Kueue's v1beta2 API
reference (kueue.x-k8s.io/v1beta2, v0.19), plus the CEL rules that matter to the chain, and the
ResourceFlavor webhook's label rule (``nodeLabels`` keys and values are Kubernetes label names and
values: name part at most 63, value at most 63, their alphabets). The limits the chain must keep
are Kueue's: ``flavors`` at most 64 in a resource group (v0.19.2 and later).

Strict where the chain writes (unknown ``spec`` fields refused, so a v1beta1 name such as
``cohort`` or ``admissionChecks`` is a 422, as pruning plus a missing required field would make
it on a real server), loose where Kueue writes (status).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema

_QUANTITY = {"anyOf": [{"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?([kMGTPE]i?|[mun])?$"},
                       {"type": "integer"}]}  # fmt: skip
_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_TOLERATION = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "key": {"type": "string"}, "operator": {"enum": ["Exists", "Equal"]},
        "value": {"type": "string"}, "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
        "tolerationSeconds": {"type": "integer"},
    },
}  # fmt: skip
_STOP = {"enum": ["None", "Hold", "HoldAndDrain"]}
_LABEL_KEY = {"type": "string", "maxLength": 317, "pattern": (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)}  # fmt: skip
_LABEL_VALUE = {"type": "string", "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"}


def _kind(spec: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    spec = {"type": "object", "additionalProperties": False, **spec}
    if required:
        spec["required"] = list(required)
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"const": "kueue.x-k8s.io/v1beta2"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": {"type": "object"},
        },
        "required": ["spec"],
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "ResourceFlavor": _kind({"properties": {
        # Kueue's ResourceFlavor webhook validates nodeLabels as Node labels (ValidateLabels).
        "nodeLabels": {"type": "object", "maxProperties": 8, "propertyNames": _LABEL_KEY,
                       "additionalProperties": _LABEL_VALUE},
        "nodeTaints": {"type": "array", "maxItems": 8},
        "tolerations": {"type": "array", "maxItems": 8, "items": _TOLERATION},
        "topologyName": _NAME,
    }}),
    "ClusterQueue": _kind({"properties": {
        "resourceGroups": {"type": "array", "maxItems": 16, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["coveredResources", "flavors"],
            "properties": {
                "coveredResources": {"type": "array", "minItems": 1, "maxItems": 64,
                                     "items": {"type": "string"}},
                "flavors": {"type": "array", "minItems": 1, "maxItems": 64, "items": {
                    "type": "object", "additionalProperties": False,
                    "required": ["name", "resources"],
                    "properties": {"name": _NAME, "resources": {
                        "type": "array", "minItems": 1, "maxItems": 64, "items": {
                            "type": "object", "additionalProperties": False,
                            "required": ["name", "nominalQuota"],
                            "properties": {"name": {"type": "string"}, "nominalQuota": _QUANTITY,
                                           "borrowingLimit": _QUANTITY, "lendingLimit": _QUANTITY},
                        }}},
                }},
            }}},
        "cohortName": {"type": "string"},
        "queueingStrategy": {"enum": ["StrictFIFO", "BestEffortFIFO"]},
        "namespaceSelector": {"type": "object"},
        "flavorFungibility": {"type": "object"},
        "preemption": {"type": "object", "additionalProperties": False, "properties": {
            "reclaimWithinCohort": {"enum": ["Never", "LowerPriority", "Any"]},
            "borrowWithinCohort": {"type": "object"},
            "withinClusterQueue": {"enum": ["Never", "LowerPriority", "LowerOrNewerEqualPriority"]},
        }},
        "admissionChecksStrategy": {"type": "object", "additionalProperties": False, "properties": {
            "admissionChecks": {"type": "array", "minItems": 1, "maxItems": 64, "items": {
                "type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {"name": _NAME, "onFlavors": {"type": "array"}},
            }},
        }},
        "stopPolicy": _STOP,
        "fairSharing": {"type": "object"},
        "admissionScope": {"type": "object"},
    }}),
    "LocalQueue": _kind({"properties": {
        "clusterQueue": {"type": "string", "minLength": 1, "maxLength": 253},
        "stopPolicy": _STOP,
        "fairSharing": {"type": "object"},
    }}, ("clusterQueue",)),
    "AdmissionCheck": _kind({"properties": {
        "controllerName": {"type": "string", "minLength": 1, "maxLength": 253},
        "parameters": {"type": "object"},
    }}, ("controllerName",)),
    "Topology": _kind({"properties": {
        "levels": {"type": "array", "minItems": 1, "maxItems": 16, "items": {
            "type": "object", "additionalProperties": False, "required": ["nodeLabel"],
            "properties": {"nodeLabel": {"type": "string", "minLength": 1}},
        }},
    }}, ("levels",)),
    "Workload": {"type": "object", "properties": {"spec": {"type": "object", "required": ["podSets"]}}},
}  # fmt: skip

KINDS = {
    "resourceflavors": "ResourceFlavor", "clusterqueues": "ClusterQueue",
    "localqueues": "LocalQueue", "admissionchecks": "AdmissionCheck", "topologies": "Topology",
    "workloads": "Workload",
}  # fmt: skip


def _cel(kind: str, body: dict[str, Any]) -> str | None:
    """The CEL rules of Kueue's CRDs the chain could break."""
    spec = body.get("spec") or {}
    if kind == "ResourceFlavor" and spec.get("topologyName") and not spec.get("nodeLabels"):
        return "spec.topologyName: at least one nodeLabel is required with a topologyName"
    if kind == "ClusterQueue":
        for group in spec.get("resourceGroups") or []:
            for flavor in group["flavors"]:
                names = [r["name"] for r in flavor["resources"]]
                if names != group["coveredResources"]:
                    return "flavors must have the same number of resources as coveredResources, in order"
    if kind == "AdmissionCheck" and body.get("_old", {}).get("controllerName") not in (
        None,
        spec.get("controllerName"),
    ):
        return "spec.controllerName is immutable"
    return None


_NODE_LABELS = jsonschema.Draft7Validator({"type": "object", "properties": {"metadata": {
    "type": "object", "properties": {"labels": {
        "type": "object", "propertyNames": _LABEL_KEY, "additionalProperties": _LABEL_VALUE,
    }},
}}})  # fmt: skip


def node_labels(body: dict[str, Any]) -> str | None:
    """The API server's label rule on a Node (``ValidateLabels``): the fake's validator for
    ``api/v1/nodes``, so a patch with an invalid label key or value is a 422."""
    error = next(iter(_NODE_LABELS.iter_errors(body)), None)
    return None if error is None else f"Node metadata.labels: {error.message}"


def validator(collection: str) -> Callable[[dict[str, Any]], str | None] | None:
    """The fake API's validator for a Kueue collection id, None for other collections."""
    group, _, plural = collection.rpartition("/")
    if not group.startswith("apis/kueue.x-k8s.io/") or plural not in KINDS:
        return None
    kind = KINDS[plural]
    schema = jsonschema.Draft7Validator(SCHEMAS[kind])

    def check(body: dict[str, Any]) -> str | None:
        error = next(iter(schema.iter_errors(body)), None)
        if error is not None:
            return f"{kind} {'.'.join(map(str, error.absolute_path))}: {error.message}"
        return _cel(kind, body)

    return check

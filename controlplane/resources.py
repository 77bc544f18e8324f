"""The API resources the control plane reads and writes, and references to single objects.

Pure data: the REST path of a resource is computed here so the adapter, the sinks and the test
fake agree on it. ``worker.gpustack.ai/v1alpha1`` holds the CRDs (:mod:`controlplane.schema.crds`).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = [
    "APISERVICES",
    "CONFIGMAPS",
    "CRDS",
    "DEVICES",
    "EVENTS",
    "GROUP",
    "LEASES",
    "MODELARTIFACTS",
    "MODELPREFETCHES",
    "MODELSTOREBINDINGS",
    "MODELSTORES",
    "MUTATING_WEBHOOKS",
    "NODEMODELSTORES",
    "NODES",
    "PODS",
    "SECRETS",
    "SUBJECTACCESSREVIEWS",
    "TOKENREVIEWS",
    "VALIDATING_WEBHOOKS",
    "VERSION",
    "Observed",
    "Ref",
    "Resource",
]

GROUP: Final = "worker.gpustack.ai"
VERSION: Final = "v1alpha1"
FIELD_MANAGER: Final = "gpustack-operator"


class Resource(msgspec.Struct, frozen=True, kw_only=True):
    """One resource type of the API (``group`` empty for the core group)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        """``/api/v1/nodes`` or ``/apis/<group>/<version>[/namespaces/<ns>]/<plural>``."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base = f"{base}/namespaces/{namespace}"
        return f"{base}/{self.plural}"


DEVICES: Final = Resource(group=GROUP, version=VERSION, plural="devices", kind="Devices")
NODEMODELSTORES: Final = Resource(
    group=GROUP, version=VERSION, plural="nodemodelstores", kind="NodeModelStore"
)
MODELARTIFACTS: Final = Resource(
    group=GROUP, version=VERSION, plural="modelartifacts", kind="ModelArtifact", namespaced=True
)
MODELSTORES: Final = Resource(group=GROUP, version=VERSION, plural="modelstores", kind="ModelStore")
MODELSTOREBINDINGS: Final = Resource(
    group=GROUP,
    version=VERSION,
    plural="modelstorebindings",
    kind="ModelStoreBinding",
    namespaced=True,
)
MODELPREFETCHES: Final = Resource(
    group=GROUP, version=VERSION, plural="modelprefetches", kind="ModelPrefetch", namespaced=True
)
NODES: Final = Resource(group="", version="v1", plural="nodes", kind="Node")
PODS: Final = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
CONFIGMAPS: Final = Resource(
    group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True
)
APISERVICES: Final = Resource(
    group="apiregistration.k8s.io", version="v1", plural="apiservices", kind="APIService"
)
SECRETS: Final = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True)
EVENTS: Final = Resource(group="", version="v1", plural="events", kind="Event", namespaced=True)
"""Create and patch only: download progress on the Pods that wait (reconciling.podevents)."""
LEASES: Final = Resource(
    group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", namespaced=True
)
# Create-only: the reviews behind the HTTPS endpoints' bearer tokens (controlplane.access.reviewer).
TOKENREVIEWS: Final = Resource(
    group="authentication.k8s.io", version="v1", plural="tokenreviews", kind="TokenReview"
)
SUBJECTACCESSREVIEWS: Final = Resource(
    group="authorization.k8s.io",
    version="v1",
    plural="subjectaccessreviews",
    kind="SubjectAccessReview",
)
MUTATING_WEBHOOKS: Final = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
)
VALIDATING_WEBHOOKS: Final = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="validatingwebhookconfigurations",
    kind="ValidatingWebhookConfiguration",
)
CRDS: Final = Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
)


class Ref(msgspec.Struct, frozen=True, kw_only=True):
    """One object: its resource, name and (for namespaced resources) namespace."""

    resource: Resource
    name: str
    namespace: str | None = None

    def path(self, subresource: str | None = None) -> str:
        p = f"{self.resource.collection_path(self.namespace)}/{self.name}"
        return f"{p}/{subresource}" if subresource else p

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.resource.plural}/{where}{self.name}"


class Observed(msgspec.Struct, frozen=True, kw_only=True):
    """An object as last read from (or written to) a sink, with its version for preconditions."""

    body: dict[str, Any]
    resource_version: str

    @classmethod
    def of(cls, body: dict[str, Any]) -> Observed:
        return cls(body=body, resource_version=str(body.get("metadata", {}).get("resourceVersion")))

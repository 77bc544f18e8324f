"""What ``kubectl explain`` says about our CRDs: a description for every schema field.

Kept apart from the schemas in :mod:`controlplane.schema.crds` so the shapes stay readable; the two
meet in :func:`describe`, which returns a described copy of a schema. Paths are dotted from
the root, ``[]`` stepping into an array's items (``spec.groups[].accelerators[].id``). A kind's
own text wins over the shared one (:data:`COMMON`); a field with neither is left without, and
a test walks every CRD and fails on it (a new field must say what it means).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

__all__ = ["COMMON", "DESCRIPTIONS", "describe", "undescribed"]

_CONDITIONS: Final = {
    "status.conditions": "The latest observations of the object's state (Kubernetes conditions).",
    "status.conditions[].type": "The condition's name, unique in the list.",
    "status.conditions[].status": "True, False or Unknown.",
    "status.conditions[].reason": "Machine-readable CamelCase cause of the last transition.",
    "status.conditions[].message": "Human-readable detail of the last transition.",
    "status.conditions[].lastTransitionTime": "When status last changed (RFC 3339).",
    "status.conditions[].observedGeneration": "The metadata.generation this condition is about.",
}

COMMON: Final[Mapping[str, str]] = {
    "apiVersion": "The versioned schema of this representation of an object "
    "(worker.gpustack.ai/v1alpha1).",
    "kind": "The REST resource this object represents.",
    "metadata": "Standard object metadata.",
    "status.observedGeneration": "The metadata.generation the status was computed from.",
    **_CONDITIONS,
}
"""Fields every CRD of ours has, or shares the shape of."""

_ACCEL: Final = "spec.groups[].accelerators[]"
_SLICED: Final = f"{_ACCEL}.status.physicalSliced.profiles[]"
_ALLOC: Final = "status.groups[].accelerators[]"

_DEVICES: Final = {
    "": "The accelerators of one node, as its device agent detected them (spec) and how much of "
    "each the device plugin has handed out (status). Named after the node; written by the "
    "worker from the bus, never by hand.",
    "spec": "What the node's device agent detected: what `dm detect` prints on the node.",
    "spec.groups": "One group per product and manufacturer.",
    "spec.groups[].id": "The group's key, from the product name (e.g. nvidia-h200).",
    "spec.groups[].manufacturer": "nvidia, amd, or another manufacturer key.",
    "spec.groups[].name": "The product name the vendor library reports.",
    "spec.groups[].memory": "Memory of one accelerator, in MiB (as the vendor reports it).",
    "spec.groups[].cores": "Compute units of one accelerator (SMs, CUs).",
    "spec.groups[].driverVersion": "The kernel driver's version.",
    "spec.groups[].runtimeVersion": "The user-space runtime's version (CUDA, ROCm).",
    "spec.groups[].computeCapability": "The architecture (CUDA compute capability, gfx target).",
    "spec.groups[].family": "The product family or IP generation, where the vendor names one.",
    "spec.groups[].simulated": "True when detected from a simulated profile (--simulate).",
    "spec.groups[].accelerators": "The cards of this group on the node.",
    f"{_ACCEL}.id": "The card's UUID (what the device plugin advertises).",
    f"{_ACCEL}.index": "The card's index on the node, as the vendor tools number it.",
    f"{_ACCEL}.physicalIndexes": "The vendor's other numbers for the card (e.g. DRM minors).",
    f"{_ACCEL}.topology": "Where the card sits: PCI path and NUMA/CPU affinity.",
    f"{_ACCEL}.topology.pciBusId": "PCI address, domain:bus:device.function.",
    f"{_ACCEL}.topology.pciRootId": "PCI address of the root port above the card.",
    f"{_ACCEL}.topology.pciSwitches": "PCI addresses of the switches between root and card.",
    f"{_ACCEL}.topology.numaAffinity": "The NUMA node the card is attached to.",
    f"{_ACCEL}.topology.cpuAffinity": "The CPUs local to the card, as a cpuset list (0-13).",
    f"{_ACCEL}.status": "Health and the ways the card can be shared.",
    f"{_ACCEL}.status.unhealthy": "True while the card is out of service (XID, ECC, lost).",
    f"{_ACCEL}.status.logicalSliced": "Software slicing (memory and compute shares), if offered.",
    f"{_ACCEL}.status.logicalSliced.coresPercentageOvercommit": "Whether compute shares may sum "
    "past 100%.",
    f"{_ACCEL}.status.logicalSliced.count": "How many slices the card can be split into.",
    f"{_ACCEL}.status.physicalSliced": "Hardware partitioning (MIG and the like), if offered.",
    f"{_ACCEL}.status.physicalSliced.profiles": "The partition profiles the card offers.",
    f"{_SLICED}.name": "The profile's name (e.g. 1g.10gb).",
    f"{_SLICED}.memoryMib": "Memory of one partition of this profile, in MiB.",
    f"{_SLICED}.computeSlices": "Compute slices one partition takes.",
    f"{_SLICED}.memorySlices": "Memory slices one partition takes.",
    f"{_SLICED}.count": "How many partitions of this profile fit on an empty card.",
    f"{_ACCEL}.status.physicalSliced.count": "Partitions currently carved on the card.",
    "status": "What the device plugin has allocated, from the allocation events on the bus.",
    "status.summary": "Counts for `kubectl get devices`.",
    "status.summary.accelerators": "Cards on the node.",
    "status.summary.unhealthy": "Cards out of service.",
    "status.summary.allocated": "Cards with any allocation (whole, shared, sliced or a partition).",
    "status.summary.memory": "Memory of one card of the first group, in human units.",
    "status.groups": "Allocation per group, mirroring spec.groups.",
    "status.groups[].id": "The spec group's id.",
    "status.groups[].manufacturer": "The spec group's manufacturer.",
    "status.groups[].accelerators": "Allocation per card.",
    f"{_ALLOC}.id": "The card's UUID.",
    f"{_ALLOC}.index": "The card's index.",
    f"{_ALLOC}.mode": "The strongest allocation on the card: None, Shared, Sliced, Partitioned, "
    "Exclusive.",
    f"{_ALLOC}.allocated": "Units allocated, of 1,600,000 per card (50% is 800,000).",
    f"{_ALLOC}.remaining": "Units left, of 1,600,000 per card.",
    f"{_ALLOC}.allocatedSlices": "Logical slices handed out.",
    f"{_ALLOC}.allocatedProfiles": "Partition instances held on the card, per profile.",
    f"{_ALLOC}.allocatedProfiles[].name": "The partition profile (e.g. 3g.71gb).",
    f"{_ALLOC}.allocatedProfiles[].count": "Instances of that profile held by containers.",
    f"{_ALLOC}.remainingProfiles": (
        "Per partition profile, how many more instances of it alone still fit on the card "
        "(every profile listed, even at 0; none fit on a card held in another mode)."
    ),
    f"{_ALLOC}.remainingProfiles[].name": "The partition profile (e.g. 1g.18gb).",
    f"{_ALLOC}.remainingProfiles[].count": "Instances of that profile that still fit.",
}

_M: Final = "status.models[]"
_NODEMODELSTORES: Final = {
    "": "The model cache of one node: how it is tuned (spec) and what it holds, downloads and "
    "failed to get (status, written by the worker from the node's model-manager).",
    "spec": "How the node's model-manager runs its cache.",
    "spec.pinned": "Manifest digests the node never collects: what ModelPrefetches retain there "
    "(written by the worker).",
    "spec.store": "The ModelStore whose overrides this node's spec carries (written by the "
    "worker; empty: the Settings alone).",
    "spec.watermarks": "When unused models are collected, as percentages of the cache filesystem.",
    "spec.watermarks.highPercent": "Collect unreferenced models once the filesystem is this full.",
    "spec.watermarks.lowPercent": "Collect down to this fullness.",
    "spec.download": "Download tuning.",
    "spec.download.concurrency": "Files downloaded at once per model.",
    "spec.download.bytesPerSecond": "Bandwidth cap for the node's downloads; 0 for none.",
    "spec.download.peerSync": "Fetch a model from another node that holds it before the Hub "
    "(where the model agents serve peers).",
    "spec.hub": "Where models come from and how to reach it.",
    "spec.hub.huggingFaceEndpoint": "The Hugging Face Hub (or a mirror) models are fetched from.",
    "spec.hub.modelScopeEndpoint": "The ModelScope endpoint ModelScope models are fetched from.",
    "spec.hub.httpsProxy": "Proxy for the Hub's HTTPS requests.",
    "spec.hub.noProxy": "Hosts reached without the proxy, comma separated.",
    "spec.hub.caBundleConfigMap": "ConfigMap holding extra CA certificates for the Hub.",
    "status": "The cache as the node's model-manager last reported it.",
    "status.capacity": "Sizes of the cache and its filesystem.",
    "status.capacity.totalBytes": "Size of the cache filesystem, in bytes.",
    "status.capacity.storedBytes": "Bytes of the complete models in the cache.",
    "status.capacity.usedPercent": "How full the cache filesystem is (what the watermarks "
    "compare).",
    "status.capacity.total": "totalBytes in human units (for `kubectl get`).",
    "status.capacity.stored": "storedBytes in human units (for `kubectl get`).",
    "status.models": "One entry per model digest: failed first, then downloading, then ready.",
    f"{_M}.digest": "The model's manifest digest (sha256:...).",
    f"{_M}.state": "Downloading, Ready or Failed.",
    f"{_M}.sizeBytes": "The model's size, in bytes.",
    f"{_M}.downloadedBytes": "Bytes downloaded and verified so far.",
    f"{_M}.progress": "For a download: how far it got, in words (42% (3.1 GiB of 7.5 GiB)).",
    f"{_M}.referenced": "Mounts using the model now (a referenced model is never collected).",
    f"{_M}.lastUsedTime": "When a volume of it was last mounted or unmounted.",
    f"{_M}.reason": "Why the last attempt failed (e.g. IntegrityMismatch, SourceUnavailable).",
    f"{_M}.message": "Detail of the failure.",
    f"{_M}.retryTime": "No new attempt starts before this time (the failure's backoff).",
    f"{_M}.source": "Hub, or Peer when more than half of its bytes came from peer nodes.",
    "status.modelCounts": "Models per state, over the whole cache.",
    "status.modelCounts.ready": "Complete, verified models.",
    "status.modelCounts.downloading": "Models being downloaded.",
    "status.modelCounts.failed": "Models whose last attempt failed.",
    "status.downloading": "Every running download's progress, for `kubectl get`.",
}

_HF: Final = "spec.source.huggingFace"
_MS: Final = "spec.source.modelScope"
_MODELARTIFACTS: Final = {
    "": "A model a namespace may mount: a Hugging Face or ModelScope repository at a revision, "
    "resolved once to a manifest digest that every node verifies its copy against.",
    "spec": "What to fetch. Immutable: create another ModelArtifact for another model.",
    "spec.source": "Where the model comes from: exactly one of its fields (only huggingFace and "
    "modelScope resolve in this build).",
    "spec.source.persistentVolumeClaim": "A PersistentVolumeClaim holding the files. Accepted "
    "but not resolved by this build (Degraded=True, SourceNotSupported).",
    "spec.source.persistentVolumeClaim.claimName": "The claim, in this namespace.",
    "spec.source.persistentVolumeClaim.path": "The directory in the claim (relative, no ..).",
    "spec.source.image": "A digest-pinned OCI image holding the files. Accepted but not resolved "
    "by this build (Degraded=True, SourceNotSupported).",
    "spec.source.image.reference": "The image reference, pinned by digest (…@sha256:…).",
    _HF: "A Hugging Face Hub repository.",
    f"{_HF}.repository": "The repository, owner/name.",
    f"{_HF}.revision": "Branch, tag or commit; resolved to a commit once.",
    f"{_HF}.secretRef": "A Secret in this namespace holding the Hub token (key `token`).",
    f"{_HF}.secretRef.name": "The Secret's name.",
    _MS: "A ModelScope model repository (the endpoint is the setting "
    "model-artifact-modelscope-endpoint).",
    f"{_MS}.repository": "The model id, owner/name.",
    f"{_MS}.revision": "Branch, tag or commit (default master); resolved to a commit once.",
    f"{_MS}.secretRef": "A Secret in this namespace holding the ModelScope access token (key "
    "`token`).",
    f"{_MS}.secretRef.name": "The Secret's name.",
    "spec.allowPatterns": "Only files matching these globs.",
    "spec.ignorePatterns": "Leave out files matching these globs.",
    "spec.expectedDigest": "Refuse the artifact unless it resolves to this manifest digest.",
    "status": "What the worker resolved, and how many nodes hold it.",
    "status.resolved": "The resolution, fixed once made.",
    "status.resolved.revision": "The commit the revision resolved to.",
    "status.resolved.manifestDigest": "The digest of the canonical manifest (sha256:...).",
    "status.resolved.digestSource": "Hub (listed at the Hub), or Expected: the Hub stayed "
    "unreachable and expectedDigest was pinned (no revision; nodes fetch it from peers only).",
    "status.resolved.fileCount": "Files in the manifest.",
    "status.resolved.sizeBytes": "Bytes in the manifest.",
    "status.resolved.resolvedTime": "When the revision was resolved and pinned.",
    "status.resolved.lastValidatedTime": "When the Hub last confirmed the pinned commit and its "
    "files (every model-artifact-revalidate-interval).",
    "status.nodes": "Nodes by the state of their copy.",
    "status.nodes.ready": "Nodes holding a complete copy.",
    "status.nodes.downloading": "Nodes downloading it.",
    "status.nodes.failed": "Nodes whose last attempt failed.",
}

_MODELSTORES: Final = {
    "": "Cache tuning for the nodes a selector picks: overrides of the Settings' watermarks and "
    "download limits in their NodeModelStore specs (the alphabetically first match wins).",
    "spec": "Which nodes, and what they get.",
    "spec.nodeSelector": "The nodes this store applies to (a label selector).",
    "spec.nodeSelector.matchLabels": "Labels a node must carry, each with this value.",
    "spec.nodeSelector.matchExpressions": "Label requirements, all of which must hold.",
    "spec.nodeSelector.matchExpressions[].key": "The label key.",
    "spec.nodeSelector.matchExpressions[].operator": "In, NotIn, Exists or DoesNotExist.",
    "spec.nodeSelector.matchExpressions[].values": "The values for In and NotIn.",
    "spec.watermarks": "Overrides of when unused models are collected (percent of the cache "
    "filesystem).",
    "spec.watermarks.highPercent": "Collect unreferenced models once the filesystem is this full.",
    "spec.watermarks.lowPercent": "Collect down to this fullness.",
    "spec.download": "Overrides of the download limits.",
    "spec.download.concurrency": "Files downloaded at once per node.",
    "spec.download.bytesPerSecond": "Download bandwidth cap per node in bytes per second.",
    "status": "What the store applies to, written by the worker.",
    "status.nodes": "Nodes whose spec this store sets.",
}

_MODELSTOREBINDINGS: Final = {
    "": "Lets this namespace's models use the caches of some ModelStores, within a byte quota "
    "enforced when a node is asked to download one of them.",
    "spec": "Which stores, and how much of them.",
    "spec.storeRefs": "The ModelStores (1 to 8) whose nodes' caches the quota covers. Immutable.",
    "spec.storeRefs[].name": "A ModelStore's name.",
    "spec.quota": "The most this namespace's models may take on those nodes together.",
    "spec.quota.bytes": "A quantity of bytes (e.g. 500Gi), counting each model once per node "
    "holding it. May only grow; absent: no limit.",
    "spec.allowPinned": "Whether ModelPrefetches naming this binding may pin models on nodes "
    "(never collected). May only go from false to true.",
    "status": "The usage the worker counted.",
    "status.phase": "Ready, OverQuota (usage is above the quota: new downloads are refused) or "
    "Error (a store is missing, or the quota is unreadable).",
    "status.phaseMessage": "Why the phase is what it is.",
    "status.usedBytes": "Bytes of this namespace's models on the stores' nodes: each distinct "
    "digest times every node holding it, ready or downloading. Absent: not measured.",
    "status.used": "usedBytes in binary units, for `kubectl get`.",
}

_MODELPREFETCHES: Final = {
    "": "Downloads a ModelArtifact onto a set of nodes ahead of its Pods, with warm-up Pods that "
    "mount it and read every file back, and optionally keeps it there.",
    "spec": "What, where, and for how long.",
    "spec.artifactRef": "The ModelArtifact in this namespace. Immutable.",
    "spec.artifactRef.name": "Its name.",
    "spec.bindingRef": "The ModelStoreBinding in this namespace whose quota the copies count "
    "against. Immutable.",
    "spec.bindingRef.name": "Its name.",
    "spec.placement": "Which nodes: instanceTypes or nodeSelector. Neither: the nodes of the "
    "binding's stores.",
    "spec.placement.instanceTypes": "InstanceType names (1 to 8): the nodes offering them.",
    "spec.placement.nodeSelector": "A label selector of nodes.",
    "spec.placement.nodeSelector.matchLabels": "Labels a node must carry, each with this value.",
    "spec.placement.nodeSelector.matchExpressions": "Label requirements, all of which must hold.",
    "spec.placement.nodeSelector.matchExpressions[].key": "The label key.",
    "spec.placement.nodeSelector.matchExpressions[].operator": "In, NotIn, Exists or DoesNotExist.",
    "spec.placement.nodeSelector.matchExpressions[].values": "The values for In and NotIn.",
    "spec.minReady": "Nodes that must hold the model for Available=True; 0: every target node.",
    "spec.retention": "How long the copies stay.",
    "spec.retention.pinned": "Never collect the copies while this prefetch exists (the binding "
    "must allow it).",
    "spec.retention.ttlAfterLastUse": "Unpin once no Pod used the model for this long (a Go "
    "duration, e.g. 72h); then Lapsed=True.",
    "status": "Delivery progress, written by the worker.",
    "status.desiredNodes": "Target nodes.",
    "status.readyNodes": "Target nodes holding the model.",
    "status.downloadingNodes": "Target nodes downloading it.",
}

DESCRIPTIONS: Final[Mapping[str, Mapping[str, str]]] = {
    "Devices": _DEVICES,
    "NodeModelStore": _NODEMODELSTORES,
    "ModelArtifact": _MODELARTIFACTS,
    "ModelStore": _MODELSTORES,
    "ModelStoreBinding": _MODELSTOREBINDINGS,
    "ModelPrefetch": _MODELPREFETCHES,
}
"""Kind -> path -> text; ``""`` is the object itself."""


def _walk(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every (path, schema) under ``schema`` that ``kubectl explain`` shows: properties."""
    out = [(path, schema)]
    for name, sub in (schema.get("properties") or {}).items():
        out += _walk(sub, f"{path}.{name}" if path else name)
    items = schema.get("items")
    if isinstance(items, dict):
        out += [(p, s) for p, s in _walk(items, path + "[]") if p != path + "[]"]
    return out


def describe(kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` with the description of every field that has one (pure).

    The copy shares no dict with ``schema`` or within itself: the schemas reuse one dict for
    every plain string field, and ``copy.deepcopy`` would keep that sharing, so the first
    description written would show on every other string field too.
    """
    out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(schema))
    own = DESCRIPTIONS.get(kind, {})
    for path, sub in _walk(out, ""):
        text = own.get(path) or COMMON.get(path)
        if text and "description" not in sub:
            sub["description"] = text
    return out


def undescribed(schema: dict[str, Any]) -> list[str]:
    """Paths of the fields without a description (for the test that keeps them all described)."""
    return [p or "<root>" for p, s in _walk(schema, "") if not s.get("description")]

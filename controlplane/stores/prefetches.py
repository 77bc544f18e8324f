"""ModelPrefetch decisions, pure and synchronous: target nodes, warm-up Pods, status, pins.

A prefetch delivers one ModelArtifact onto a set of nodes before any workload asks for it. The
delivery uses nothing but the normal mount path: one **warm-up Pod** per target node that does
not hold the model yet, bound to that node (``spec.nodeName``), mounting the artifact's CSI
volume and reading every file back (``sha256sum`` of each, so a tree is really read through
the mount). The node's agent downloads and verifies exactly as for any Pod, the binding's quota
included. Warm-up Pods never carry ``kueue.x-k8s.io/queue-name``: they request no accelerator
and must not wait for, or count against, a queue.

Targets: ``placement.nodeSelector``, or ``placement.instanceTypes`` (a node offers an
InstanceType when it carries the labels the chain's flavors select on: its accelerator group's
feature label, its general group's, and ``kubernetes.io/os``/``arch``), or, with neither, every
node; always narrowed to the nodes the binding's stores won (the binding is what lets the
namespace use a node's cache).

Retention: ``retention.pinned`` or ``retention.ttlAfterLastUse`` pins the digest on every target
node (``NodeModelStore.spec.pinned``: never collected) when the binding has ``allowPinned``.
With a TTL, once no target node has used the model for that long (and none mounts it), the
prefetch is ``Lapsed``: pins go, and no new warm-up Pod is made (the copies may be collected).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from bus import events
from controlplane.stores import storespec
from controlplane.stores.bindings import settle, store_refs
from kit.values import InvalidValue, parse_duration

__all__ = [
    "MODEL_PATH",
    "POD_LABEL",
    "Plan",
    "Situation",
    "decide",
    "instance_type_labels",
    "warmup_pod",
]

POD_LABEL: Final = "prefetch.gpustack.ai/uid"
"""On every warm-up Pod: the uid of the ModelPrefetch it serves (also its owner)."""
NODE_ANNOTATION: Final = "prefetch.gpustack.ai/node"
MODEL_PATH: Final = "/var/lib/gpustack/model"
DRIVER: Final = "model.csi.gpustack.ai"
READ_BACK: Final = f"find {MODEL_PATH}/ -type f -exec sha256sum {{}} + > /dev/null"
_DOWNLOADING: Final = frozenset({"pending", "downloading"})


@dataclass(frozen=True)
class Situation:
    """Everything one decision reads, as listed (bodies are the API's objects)."""

    prefetch: Mapping[str, Any]
    artifact: Mapping[str, Any] | None
    binding: Mapping[str, Any] | None
    nodes: Mapping[str, Mapping[str, str]]
    """Node -> labels."""
    node_store: Mapping[str, str]
    instance_types: Mapping[str, Mapping[str, Any]]
    models: Mapping[str, tuple[events.ModelState, ...] | None]
    pods: Sequence[Mapping[str, Any]]
    """The prefetch's warm-up Pods (labelled with its uid)."""
    now: datetime


@dataclass
class Plan:
    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    """Names of warm-up Pods to delete."""
    pins: dict[str, str] = field(default_factory=dict)
    """Node -> digest to pin there."""


def instance_type_labels(spec: Mapping[str, Any]) -> dict[str, str]:
    """The node labels that make a node offer an InstanceType (as the chain's flavors)."""
    out = {
        "kubernetes.io/os": str(spec.get("os") or ""),
        "kubernetes.io/arch": str(spec.get("arch") or ""),
    }
    if spec.get("acceleratorGroup"):
        out[f"acceleratable.feature.gpustack.ai/{spec['acceleratorGroup']}"] = "true"
    if spec.get("generalGroup"):
        out[f"general.feature.gpustack.ai/{spec['generalGroup']}"] = "true"
    return {k: v for k, v in out.items() if v}


def targets(s: Situation) -> list[str]:
    """The target nodes, sorted (see the module's docstring)."""
    placement = (s.prefetch.get("spec") or {}).get("placement") or {}
    stores = set(store_refs(s.binding or {}))
    chosen = []
    for node, labels in sorted(s.nodes.items()):
        if s.node_store.get(node) not in stores:
            continue
        if placement.get("nodeSelector") is not None:
            if not storespec.matches(placement["nodeSelector"], labels):
                continue
        elif placement.get("instanceTypes"):
            wanted = [
                instance_type_labels((s.instance_types.get(name) or {}).get("spec") or {})
                for name in placement["instanceTypes"]
                if name in s.instance_types
            ]
            if not any(w and all(labels.get(k) == v for k, v in w.items()) for w in wanted):
                continue
        chosen.append(node)
    return chosen


def _state(s: Situation, node: str, digest: str) -> events.ModelState | None:
    return next((m for m in s.models.get(node) or () if (m.digest or m.model) == digest), None)


def _lapsed(s: Situation, nodes: Iterable[str], digest: str, ttl_s: float | None) -> bool:
    """No target node used the model for ``ttl_s`` (and none mounts it now)."""
    if ttl_s is None:
        return False
    held = [m for n in nodes if (m := _state(s, n, digest)) is not None and m.state == "ready"]
    if not held or any(m.referenced for m in held):
        return False
    last = [m.last_used for m in held if m.last_used is not None]
    return bool(last) and (s.now - max(last)).total_seconds() >= ttl_s


def _ttl(spec: Mapping[str, Any]) -> float | None:
    raw = (spec.get("retention") or {}).get("ttlAfterLastUse")
    if raw is None:
        return None
    try:
        return parse_duration(str(raw))
    except (InvalidValue, ValueError):
        return None


def _blocked(s: Situation) -> tuple[str, str] | None:
    """Why nothing can be delivered (reason, message), or None."""
    spec = s.prefetch.get("spec") or {}
    artifact = (spec.get("artifactRef") or {}).get("name")
    binding = (spec.get("bindingRef") or {}).get("name")
    if s.binding is None:
        return "BindingNotFound", f"no ModelStoreBinding {binding} in this namespace"
    phase = (s.binding.get("status") or {}).get("phase")
    if phase in ("OverQuota", "Error"):
        return f"Binding{phase}", f"ModelStoreBinding {binding} is {phase}"
    if s.artifact is None:
        return "ArtifactNotFound", f"no ModelArtifact {artifact} in this namespace"
    status = s.artifact.get("status") or {}
    if not (status.get("resolved") or {}).get("manifestDigest"):
        return "ArtifactNotResolved", f"ModelArtifact {artifact} is not resolved yet"
    if any(c.get("type") == "Resolved" and c.get("status") == "False"
           for c in status.get("conditions") or ()):  # fmt: skip
        return "ArtifactNotResolved", f"ModelArtifact {artifact} is revoked (Resolved=False)"
    return None


@dataclass(frozen=True)
class _Counts:
    nodes: list[str]
    ready: list[str]
    downloading: list[str]
    failed: list[str]


def _counts(s: Situation, nodes: list[str], digest: str | None) -> _Counts:
    states = {n: _state(s, n, digest) if digest else None for n in nodes}
    return _Counts(
        nodes=nodes,
        ready=[n for n, m in states.items() if m is not None and m.state == "ready"],
        downloading=[n for n, m in states.items() if m is not None and m.state in _DOWNLOADING],
        failed=[n for n, m in states.items() if m is not None and m.state == "failed"],
    )


def decide(s: Situation, image: str, now_text: str) -> Plan:
    """Status, warm-up Pods to create and delete, and pins (one prefetch)."""
    spec = s.prefetch.get("spec") or {}
    blocked = _blocked(s)
    resolved = ((s.artifact or {}).get("status") or {}).get("resolved") or {}
    digest: str | None = resolved.get("manifestDigest")
    c = _counts(s, targets(s), digest)
    ttl = _ttl(spec)
    lapsed = digest is not None and _lapsed(s, c.nodes, digest, ttl)
    wants_pins = bool((spec.get("retention") or {}).get("pinned")) or ttl is not None
    allowed = bool(((s.binding or {}).get("spec") or {}).get("allowPinned"))
    plan = Plan(status={})
    if digest and blocked is None and wants_pins and allowed and not lapsed:
        plan.pins = dict.fromkeys(c.nodes, digest)
    _pods(s, plan, c.nodes, set(c.ready), deliver=blocked is None and not lapsed, image=image)
    degraded = blocked or _degraded(c, pinning_refused=wants_pins and not allowed)
    need = int(spec.get("minReady") or 0) or len(c.nodes)
    conditions = _conditions(c, need, blocked, degraded, lapsed=lapsed)
    previous = (s.prefetch.get("status") or {}).get("conditions") or []
    plan.status = {
        "desiredNodes": len(c.nodes),
        "readyNodes": len(c.ready),
        "downloadingNodes": len(c.downloading),
        "conditions": settle(conditions, previous, now_text),
    }
    generation = (s.prefetch.get("metadata") or {}).get("generation")
    if isinstance(generation, int):
        plan.status["observedGeneration"] = generation
    return plan


def _degraded(c: _Counts, *, pinning_refused: bool) -> tuple[str, str] | None:
    if pinning_refused:
        return "PinningNotAllowed", "the ModelStoreBinding does not allow pinning: not pinned"
    if not c.nodes:
        return "NoTargetNodes", "no node of the binding's stores matches the placement"
    if c.failed:
        failed = ", ".join(c.failed[:5])
        return "NodesFailed", f"the download failed on {len(c.failed)} node(s): {failed}"
    return None


def _conditions(
    c: _Counts,
    need: int,
    blocked: tuple[str, str] | None,
    degraded: tuple[str, str] | None,
    *,
    lapsed: bool,
) -> list[dict[str, Any]]:
    missing = len(c.ready) < len(c.nodes)
    progress = f"{len(c.ready)} of {len(c.nodes)} nodes ready, {len(c.downloading)} downloading"
    if blocked is not None:
        progressing = _cond("Progressing", False, blocked[0], blocked[1])
    elif lapsed:
        progressing = _cond("Progressing", False, "Lapsed", progress)
    else:
        progressing = _cond(
            "Progressing", missing, "Downloading" if missing else "Complete", progress
        )
    available = bool(c.nodes) and len(c.ready) >= need
    return [
        progressing,
        _cond("Available", available, "MinReady" if available else "NotEnoughReady",
              f"{len(c.ready)} ready, {need} needed"),
        _cond("Degraded", degraded is not None, degraded[0] if degraded else "AsExpected",
              degraded[1] if degraded else ""),
        _cond("Lapsed", lapsed, "TTLExpired" if lapsed else "InUse",
              "unused on every target node for ttlAfterLastUse: unpinned" if lapsed else ""),
    ]  # fmt: skip


def _cond(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}


def _pods(
    s: Situation, plan: Plan, nodes: Sequence[str], ready: set[str], *, deliver: bool, image: str
) -> None:
    """Delete finished or misplaced warm-up Pods; create one for each node still without."""
    have: dict[str, Mapping[str, Any]] = {}
    for pod in s.pods:
        node = ((pod.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION, "")
        phase = (pod.get("status") or {}).get("phase")
        name = pod["metadata"]["name"]
        if node not in nodes or phase in ("Succeeded", "Failed") or not deliver:
            plan.delete.append(name)
        else:
            have[node] = pod
    if not deliver or s.artifact is None:
        return
    for node in nodes:
        if node not in ready and node not in have:
            plan.create.append(warmup_pod(s.prefetch, s.artifact, node, image))


def pod_name(prefetch: str, node: str) -> str:
    """``<prefetch>-warmup-<10 hex>``, within a DNS label's 63 characters; the hex is of the
    prefetch's whole name and the node, so two long names sharing a prefix never collide."""
    tail = "-warmup-" + hashlib.sha256(f"{prefetch}\0{node}".encode()).hexdigest()[:10]
    return prefetch[: 63 - len(tail)].rstrip("-.") + tail


def warmup_pod(
    prefetch: Mapping[str, Any], artifact: Mapping[str, Any], node: str, image: str
) -> dict[str, Any]:
    """The warm-up Pod of ``node``: bound there, reading the artifact's volume back."""
    meta, art = prefetch["metadata"], artifact["metadata"]
    resolved = (artifact.get("status") or {}).get("resolved") or {}
    csi: dict[str, Any] = {
        "driver": DRIVER,
        "readOnly": True,
        "volumeAttributes": {"artifact": art["name"], "artifactUID": art.get("uid", ""),
                             "manifestDigest": resolved.get("manifestDigest", "")},
    }  # fmt: skip
    secret = (((artifact.get("spec") or {}).get("source") or {}).get("huggingFace") or {}).get(
        "secretRef"
    )
    if secret and secret.get("name"):
        csi["nodePublishSecretRef"] = {"name": secret["name"]}
    owner = {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "ModelPrefetch",
             "name": meta["name"], "uid": meta.get("uid", ""), "controller": True,
             "blockOwnerDeletion": False}  # fmt: skip
    container = {
        "name": "warmup", "image": image, "command": ["sh", "-c", READ_BACK],
        "volumeMounts": [{"name": "gpustack-model", "mountPath": MODEL_PATH, "readOnly": True}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
    }  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(meta["name"], node),
            "namespace": meta.get("namespace", ""),
            "labels": {
                POD_LABEL: meta.get("uid", ""),
                "app.kubernetes.io/managed-by": "gpustack-operator",
            },
            "annotations": {NODE_ANNOTATION: node},
            "ownerReferences": [owner],
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "OnFailure",
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
            "volumes": [{"name": "gpustack-model", "csi": csi}],
        },
    }

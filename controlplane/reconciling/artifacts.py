"""ModelArtifact decisions, pure and synchronous: spec, status, conditions, record, backoff.

A ModelArtifact is resolved against the Hub *once*: the first successful resolution pins the
commit and the manifest digest in ``status.resolved``, and the spec is immutable after creation
(the CRD refuses changes with a CEL rule; :func:`spec_changed` catches an API server or a sink
that does not enforce it, from ``metadata.generation``). Afterwards only ``status.nodes`` moves,
from the nodes' ``models`` events (models are keyed by manifest digest).

Conditions:

==========  ======  ===================================================================
type        status  when
==========  ======  ===================================================================
Resolved    True    ``status.resolved`` is set (reason ``Resolved``)
Resolved    False   not yet, or the last attempt failed (reason: the failure's reason)
Degraded    True    a permanent failure: ``AccessDenied`` (Hub 401/403/404),
                    ``RevisionNotFound``, ``DigestMismatch``, ``InvalidSpec``, ``SpecChanged``,
                    ``SecretNotFound``
Degraded    False   otherwise (a temporary failure such as ``SourceUnavailable`` is retried
                    with backoff and does not degrade the artifact)
==========  ======  ===================================================================

``lastTransitionTime`` only changes when a condition's status does, so an unchanged artifact
costs no write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from bus import events, records
from controlplane.resolving import Resolved
from kit.backoff import Backoff

__all__ = [
    "Failure",
    "Spec",
    "backoff_s",
    "conditions",
    "node_counts",
    "parse_spec",
    "record",
    "spec_changed",
    "status",
]

_NODE_STATE: Final = {
    "pending": "downloading",
    "downloading": "downloading",
    "ready": "ready",
    "evicting": "ready",
    "failed": "failed",
}


class _Camel(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


class SecretName(_Camel, frozen=True, kw_only=True):
    name: str


class HuggingFace(_Camel, frozen=True, kw_only=True):
    repository: str
    revision: str = "main"
    secret_ref: SecretName | None = None


class ModelScope(_Camel, frozen=True, kw_only=True):
    repository: str
    revision: str = "master"
    secret_ref: SecretName | None = None


class Source(_Camel, frozen=True, kw_only=True):
    """``spec.source``: exactly one hub (:func:`parse_spec` refuses none or both)."""

    hugging_face: HuggingFace | None = None
    model_scope: ModelScope | None = None

    @property
    def hub(self) -> tuple[str, HuggingFace | ModelScope]:
        """``(hub kind, its source)``: ``modelscope`` or ``huggingface`` (:mod:`hub.kinds`)."""
        if self.model_scope is not None:
            return "modelscope", self.model_scope
        assert self.hugging_face is not None  # parse_spec guarantees one
        return "huggingface", self.hugging_face


class Spec(_Camel, frozen=True, kw_only=True):
    """``ModelArtifact.spec`` as the worker reads it."""

    source: Source
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    expected_digest: str | None = None


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    """Why an artifact is not resolved; ``temporary`` failures are retried sooner."""

    reason: str
    message: str
    temporary: bool = False


def parse_spec(body: Mapping[str, Any]) -> Spec | Failure:
    """The spec of a ModelArtifact object, or an ``InvalidSpec`` failure naming the problem."""
    try:
        spec = msgspec.convert(body.get("spec") or {}, Spec)
    except msgspec.ValidationError as e:
        return Failure(reason="InvalidSpec", message=f"spec: {e}")
    hf, ms = spec.source.hugging_face, spec.source.model_scope
    if (hf is None) == (ms is None):
        message = "spec.source must name exactly one of huggingFace and modelScope"
        return Failure(reason="InvalidSpec", message=message)
    field = "huggingFace" if hf is not None else "modelScope"
    if not spec.source.hub[1].repository:
        return Failure(reason="InvalidSpec", message=f"spec.source.{field}.repository is empty")
    return spec


def spec_changed(body: Mapping[str, Any]) -> bool:
    """True when the spec was changed after creation (``metadata.generation`` above 1)."""
    generation = (body.get("metadata") or {}).get("generation")
    return isinstance(generation, int) and generation > 1


def node_counts(
    models: Iterable[tuple[events.ModelState, ...] | None], digest: str
) -> dict[str, int]:
    """How many nodes hold ``digest`` ready, downloading or failed (one state per node)."""
    counts = {"ready": 0, "downloading": 0, "failed": 0}
    for node_models in models:
        for m in node_models or ():
            if (m.digest or m.model) == digest:
                counts[_NODE_STATE[m.state]] += 1
                break
    return counts


def _condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}


def conditions(
    previous: Iterable[Mapping[str, Any]],
    resolved: bool,
    failure: Failure | None,
    now: str,
) -> list[dict[str, Any]]:
    """Resolved and Degraded, keeping ``lastTransitionTime`` where the status did not change."""
    if resolved:
        res = _condition("Resolved", True, "Resolved", "")
    elif failure is not None:
        res = _condition("Resolved", False, failure.reason, failure.message)
    else:
        res = _condition("Resolved", False, "Resolving", "")
    if failure is not None and not failure.temporary:
        deg = _condition("Degraded", True, failure.reason, failure.message)
    else:
        deg = _condition("Degraded", False, "AsExpected", "")
    before = {c.get("type"): c for c in previous}
    for c in (res, deg):
        old = before.get(c["type"])
        same = old is not None and old.get("status") == c["status"]
        c["lastTransitionTime"] = old.get("lastTransitionTime", now) if same and old else now
    return [res, deg]


def status(
    current: Mapping[str, Any],
    *,
    resolved: Resolved | None,
    failure: Failure | None,
    counts: Mapping[str, int],
    now: str,
) -> dict[str, Any]:
    """The whole desired ``status``; ``resolved`` None keeps what ``current`` already pinned."""
    old = current.get("status") or {}
    out: dict[str, Any] = {}
    generation = (current.get("metadata") or {}).get("generation")
    if isinstance(generation, int):
        out["observedGeneration"] = generation
    pinned: dict[str, Any] | None = old.get("resolved")
    if resolved is not None:
        pinned = {
            "revision": resolved.commit,
            "manifestDigest": resolved.digest,
            "fileCount": resolved.file_count,
            "sizeBytes": resolved.size_bytes,
        }
    if pinned:
        out["resolved"] = pinned
    out["nodes"] = dict(counts)
    out["conditions"] = conditions(old.get("conditions") or (), bool(pinned), failure, now)
    return out


def record(body: Mapping[str, Any], spec: Spec | None) -> records.ArtifactRecord | None:
    """What node agents need about this artifact (never the token: only where it is kept)."""
    meta = body.get("metadata") or {}
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    if spec is None or not name:
        return None
    hf, ms = spec.source.hugging_face, spec.source.model_scope
    _, chosen = spec.source.hub
    pinned = (body.get("status") or {}).get("resolved") or {}
    secret = (
        records.SecretRef(namespace=namespace, name=chosen.secret_ref.name)
        if chosen.secret_ref is not None
        else None
    )
    return records.ArtifactRecord(
        namespace=namespace,
        name=name,
        uid=meta.get("uid") or "",
        source=records.HuggingFaceSource(repository=hf.repository, revision=hf.revision)
        if hf is not None
        else None,
        model_scope=records.ModelScopeSource(repository=ms.repository, revision=ms.revision)
        if ms is not None
        else None,
        manifest_digest=pinned.get("manifestDigest"),
        revision=pinned.get("revision"),
        token_secret=secret,
        allow_patterns=spec.allow_patterns,
        ignore_patterns=spec.ignore_patterns,
    )


def backoff_s(attempt: int, failure: Failure, *, base_s: float, cap_s: float) -> float:
    """Seconds before trying again: exponential for temporary failures, ``cap_s`` otherwise."""
    if not failure.temporary:
        return cap_s
    return Backoff(min(base_s, cap_s), cap_s).delay_s(attempt)

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
                    ``SecretNotFound``, ``SourceNotSupported`` (a ``persistentVolumeClaim`` or
                    ``image`` source: :data:`UNSUPPORTED` says why)
Degraded    False   otherwise (a temporary failure such as ``SourceUnavailable`` is retried
                    with backoff and does not degrade the artifact)
==========  ======  ===================================================================

Once resolved, the artifact is revalidated (:mod:`controlplane.reconciling.revalidating`): a
failed check degrades it, a repeated refusal revokes it (Resolved=False with the pin kept, and
the agents' record without a digest).

``lastTransitionTime`` only changes when a condition's status does, so an unchanged artifact
costs no write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from bus import events, records
from controlplane.reconciling.hubresolver import Resolved
from kit.backoff import Backoff

__all__ = [
    "Failure",
    "Spec",
    "anchors",
    "backoff_s",
    "conditions",
    "node_counts",
    "parse_spec",
    "record",
    "spec_changed",
    "status",
]

ANCHOR_AFTER: Final = 2
"""Consecutive unreachable resolutions after which an ``expectedDigest`` is pinned."""
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


class Claim(_Camel, frozen=True, kw_only=True):
    claim_name: str
    path: str = ""


class Image(_Camel, frozen=True, kw_only=True):
    reference: str


class Source(_Camel, frozen=True, kw_only=True):
    """Exactly one of the fields (the CRD's rule); only the hub sources resolve in this build."""

    hugging_face: HuggingFace | None = None
    model_scope: ModelScope | None = None
    persistent_volume_claim: Claim | None = None
    image: Image | None = None

    @property
    def hub(self) -> tuple[str, HuggingFace | ModelScope]:
        """``(hub kind, its source)``: ``modelscope`` or ``huggingface`` (:mod:`hub.kinds`), of
        a :class:`Spec` that :func:`parse_spec` accepted (always one).

        :raises ValueError: not a hub source.
        """
        if self.model_scope is not None:
            return "modelscope", self.model_scope
        if self.hugging_face is None:
            raise ValueError("not a hub source")
        return "huggingface", self.hugging_face


UNSUPPORTED: Final = {
    "persistentVolumeClaim": "a persistentVolumeClaim source is not supported by this build: the "
    "node's model agent holds no Kubernetes rights and cannot mount a claim, so nothing could "
    "list or copy its files; copy the model into a Hugging Face or ModelScope repository or "
    "mirror instead",
    "image": "an image source is not supported by this build: the model agent has no OCI "
    "registry client to fetch and verify image layers; publish the model to a Hugging Face or "
    "ModelScope repository or mirror instead",
}
"""Why each source this build refuses is refused (the condition's message)."""


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
    source = spec.source
    hubs = [k for k, v in (("huggingFace", source.hugging_face),
                           ("modelScope", source.model_scope)) if v is not None]  # fmt: skip
    named = [k for k, v in (("persistentVolumeClaim", source.persistent_volume_claim),
                            ("image", source.image)) if v is not None]  # fmt: skip
    if len(hubs) + len(named) > 1:
        message = (
            "spec.source names more than one source: name exactly one of huggingFace and modelScope"
        )
        return Failure(reason="InvalidSpec", message=message)
    if not hubs:
        if named:
            return Failure(reason="SourceNotSupported", message=UNSUPPORTED[named[0]])
        message = "spec.source names no source: name exactly one of huggingFace and modelScope"
        return Failure(reason="InvalidSpec", message=message)
    if not source.hub[1].repository:
        return Failure(reason="InvalidSpec", message=f"spec.source.{hubs[0]}.repository is empty")
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
    revoked: bool = False,
    passed: bool = False,
) -> dict[str, Any]:
    """The whole desired ``status``; ``resolved`` None keeps what ``current`` already pinned.

    ``revoked``: a revalidation took the resolution back (Resolved=False, the pin kept);
    ``passed``: a revalidation passed now (``lastValidatedTime`` moves to ``now``).
    """
    old = current.get("status") or {}
    out: dict[str, Any] = {}
    generation = (current.get("metadata") or {}).get("generation")
    if isinstance(generation, int):
        out["observedGeneration"] = generation
    pinned: dict[str, Any] | None = old.get("resolved")
    if resolved is not None:
        pinned = {**_pin(resolved), "resolvedTime": now, "lastValidatedTime": now}
    elif pinned and passed:
        pinned = {**pinned, "lastValidatedTime": now}
    if pinned:
        out["resolved"] = pinned
    out["nodes"] = dict(counts)
    held = bool(pinned) and not revoked
    out["conditions"] = conditions(old.get("conditions") or (), held, failure, now)
    return out


def _pin(resolved: Resolved) -> dict[str, Any]:
    """``status.resolved``: the commit and manifest listed at the Hub, or only the anchor."""
    if resolved.digest_source == "Expected":
        return {"manifestDigest": resolved.digest, "digestSource": "Expected"}
    return {
        "revision": resolved.commit,
        "manifestDigest": resolved.digest,
        "digestSource": "Hub",
        "fileCount": resolved.file_count,
        "sizeBytes": resolved.size_bytes,
    }


def anchors(spec: Spec | None, failure: Failure, unreachable: int) -> bool:
    """Whether to pin ``spec``'s ``expectedDigest`` instead of waiting for the Hub: it has one,
    and the Hub was unreachable (``SourceUnavailable``) for the :data:`ANCHOR_AFTER` th time in
    a row. A refusal (``AccessDenied``, ``RevisionNotFound``) never anchors: the Hub answered."""
    return (
        spec is not None
        and spec.expected_digest is not None
        and failure.reason == "SourceUnavailable"
        and unreachable >= ANCHOR_AFTER
    )


def record(
    body: Mapping[str, Any],
    spec: Spec | None,
    quotas: tuple[records.BindingQuota, ...] = (),
) -> records.ArtifactRecord | None:
    """What node agents need about this artifact (never the token: only where it is kept),
    with the quotas of its namespace's ModelStoreBindings (enforced at mount time)."""
    meta = body.get("metadata") or {}
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    if spec is None or not name:
        return None
    hf, ms = spec.source.hugging_face, spec.source.model_scope
    _, chosen = spec.source.hub
    status = body.get("status") or {}
    pinned = status.get("resolved") or {}
    if any(c.get("type") == "Resolved" and c.get("status") == "False"
           for c in status.get("conditions") or ()):  # fmt: skip
        pinned = {}  # revoked by a revalidation: no new mount
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
        digest_source=pinned.get("digestSource"),
        token_secret=secret,
        allow_patterns=spec.allow_patterns,
        ignore_patterns=spec.ignore_patterns,
        size_bytes=pinned.get("sizeBytes"),
        quotas=quotas,
    )


def backoff_s(attempt: int, failure: Failure, *, base_s: float, cap_s: float) -> float:
    """Seconds before trying again: exponential for temporary failures, ``cap_s`` otherwise."""
    if not failure.temporary:
        return cap_s
    return Backoff(min(base_s, cap_s), cap_s).delay_s(attempt)

"""Every record the control plane pushes to agents through :data:`bus.kv.AGENTS_BUCKET`.

One module, one shape per record: the control plane encodes these and the node agents decode
the very same classes, so the two sides cannot drift apart. Keys and buckets are in
:mod:`bus.kv`; this module knows nothing of JetStream.

- :class:`StoreSpecRecord` (key ``nms.<node>``): a node's NodeModelStore ``spec`` as the API
  holds it; the plugin reads it as a :class:`StoreSpec`, whose :meth:`StoreSpec.problems` refuse
  invalid values (a plugin holding an invalid spec downloads and collects nothing).
- :class:`ArtifactRecord` (key ``artifacts.<namespace>.<name>``): a ModelArtifact a Pod in
  ``namespace`` may mount, what authorizes a volume. A pull token is never on the bus: the record
  names the Secret (:class:`SecretRef`) and only the node that mounts the artifact reads it.
  It also carries the quotas of the namespace's ModelStoreBindings (:class:`BindingQuota`) and the
  model's size: a NodePublishVolume that would download the model onto a store a binding
  covers is refused when the download would take the binding past its quota.
- :class:`PendingContainers` (key ``pending.<node>``): the containers bound to a node that wait
  for a sliced or partitioned device, with what each asked for. kubelet's Allocate names only
  device IDs; this record is how the device agent, which holds no Kubernetes access, learns which
  container it allocates for and how many units, memory and cores that container asked for. A
  Pod with a visibility request also lists its visibility and exclusive or shared claims, so the
  agent can give the sidecar exactly its owner's cards.

The wire format is a public contract between control planes and agents of different versions:
field names are camelCase like the CRDs they mirror, defaults are omitted, and unknown fields are
ignored so an older reader accepts a newer writer. Change a field only by adding an optional one.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final

import msgspec

__all__ = [
    "ArtifactRecord",
    "BindingQuota",
    "Download",
    "HubEndpoint",
    "HuggingFaceSource",
    "ModelScopeSource",
    "PendingContainer",
    "PendingContainers",
    "SecretRef",
    "StoreSpec",
    "StoreSpecRecord",
    "Watermarks",
    "is_digest",
]


_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")


def is_digest(value: str) -> bool:
    """Whether ``value`` is ``sha256:`` and 64 lowercase hex digits (a manifest digest)."""
    return _DIGEST.fullmatch(value) is not None


class _Record(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    omit_defaults=True,
    forbid_unknown_fields=False,
):
    pass


class Watermarks(_Record, frozen=True, kw_only=True):
    high_percent: int = 80
    """Collect unreferenced models when the filesystem is fuller than this."""
    low_percent: int = 70
    """...down to this."""


class Download(_Record, frozen=True, kw_only=True):
    concurrency: int = 8
    """HTTP requests in flight on the node, all downloads together (1..64)."""
    bytes_per_second: int = 0
    """Node-wide bandwidth limit; 0 means unlimited."""
    peer_sync: bool = True
    """Fetch from peer model agents that hold a digest before the Hub (``model-store-peer-sync``;
    only where the agent serves peers, ``--peer-port``)."""


class HubEndpoint(_Record, frozen=True, kw_only=True):
    hugging_face_endpoint: str | None = None
    """None: the plugin's own default (``HF_ENDPOINT``, else https://huggingface.co)."""
    model_scope_endpoint: str | None = None
    """None: the plugin's own default (``MODELSCOPE_DOMAIN``, else https://www.modelscope.cn)."""
    https_proxy: str | None = None
    no_proxy: str | None = None
    ca_bundle: str | None = None
    """PEM text of extra CAs (the worker reads the ConfigMap and inlines it)."""


class StoreSpec(_Record, frozen=True, kw_only=True):
    """A node's NodeModelStore ``spec`` as the plugin follows it (from :class:`StoreSpecRecord`)."""

    watermarks: Watermarks = Watermarks()
    download: Download = Download()
    hub: HubEndpoint = HubEndpoint()
    pinned: tuple[str, ...] = ()
    """Digests never collected (ModelPrefetch retention)."""
    generation: int = 0
    """The NodeModelStore's ``metadata.generation`` this spec is (status.observedGeneration)."""
    store: str | None = None
    """The ModelStore that won this node (``spec.store``); None: no store selects it."""

    def problems(self) -> list[str]:
        """Why this spec is invalid; empty when it is valid."""
        found = []
        w, d = self.watermarks, self.download
        if not 2 <= w.high_percent <= 95:
            found.append(f"watermarks.highPercent {w.high_percent} is not in 2..95")
        if not 1 <= w.low_percent < w.high_percent:
            found.append(f"watermarks.lowPercent {w.low_percent} is not in 1..highPercent-1")
        if not 1 <= d.concurrency <= 64:
            found.append(f"download.concurrency {d.concurrency} is not in 1..64")
        if d.bytes_per_second < 0:
            found.append(f"download.bytesPerSecond {d.bytes_per_second} is negative")
        for name, endpoint in (
            ("huggingFaceEndpoint", self.hub.hugging_face_endpoint),
            ("modelScopeEndpoint", self.hub.model_scope_endpoint),
        ):
            if endpoint is not None and not endpoint.startswith(("https://", "http://")):
                found.append(f"hub.{name} is not an http(s) URL")
        found.extend(f"pinned {p!r} is not a digest" for p in self.pinned if not is_digest(p))
        return found


class StoreSpecRecord(_Record, frozen=True, kw_only=True):
    """A node's NodeModelStore spec as the control plane pushes it.

    ``spec`` stays the API's untyped object, so a control plane that knows a newer field passes
    it through; the plugin converts it to a :class:`StoreSpec` and checks it itself.
    """

    node: str
    spec: dict[str, Any]


class SecretRef(_Record, frozen=True, kw_only=True):
    """Where a pull token is kept; the token itself never travels on the bus."""

    namespace: str
    name: str
    key: str = "token"


class HuggingFaceSource(_Record, frozen=True, kw_only=True):
    """``spec.source.huggingFace``."""

    repository: str
    revision: str = "main"
    """The ref the artifact asked for (a branch, tag or commit); the commit it resolved to is
    :attr:`ArtifactRecord.revision`."""


class BindingQuota(_Record, frozen=True, kw_only=True):
    """One ``ModelStoreBinding`` of an artifact's namespace, as a mount checks its quota.

    Added within v1 (optional on :class:`ArtifactRecord`): an older agent ignores it and enforces
    no quota; an older control plane sends none, and a newer agent enforces none.
    """

    name: str
    """The binding (named in the refusal)."""
    stores: tuple[str, ...]
    """``spec.storeRefs[].name``: the quota covers the nodes these ModelStores won."""
    quota_bytes: int | None = None
    """``spec.quota.bytes`` in bytes; None: no quota."""
    used_bytes: int = 0
    """``status.usedBytes``: each distinct digest of the namespace's artifacts times every node
    of those stores holding it (ready or downloading), as the control plane last counted."""


class ModelScopeSource(_Record, frozen=True, kw_only=True):
    """``spec.source.modelScope``: a ModelScope model repository."""

    repository: str
    revision: str = "master"


class ArtifactRecord(_Record, frozen=True, kw_only=True):
    """One ``ModelArtifact`` as the node agents see it: what authorizes and fills a volume."""

    namespace: str
    name: str
    uid: str
    source: HuggingFaceSource | None = None
    """``spec.source.huggingFace``; None for a ModelScope artifact. (Written always before
    ModelScope existed: an agent that old cannot decode a ModelScope record, so skips it rather
    than fetch it from the wrong hub.)"""
    model_scope: ModelScopeSource | None = None
    manifest_digest: str | None = None
    """``status.resolved.manifestDigest``; absent until the artifact is resolved."""
    revision: str | None = None
    """``status.resolved.revision``: the 40-hex commit the digest was listed at."""
    digest_source: str | None = None
    """``status.resolved.digestSource``: ``Hub``, or ``Expected`` when the Hub could not be
    reached and the artifact was pinned to its ``expectedDigest`` (no ``revision``: its nodes
    fetch it from peers only). Absent from older control planes: ``Hub``."""
    token_secret: SecretRef | None = None
    allow_patterns: tuple[str, ...] = ()
    """``spec.allowPatterns``: the files the manifest was listed with."""
    ignore_patterns: tuple[str, ...] = ()
    size_bytes: int | None = None
    """``status.resolved.sizeBytes`` (added within v1): what a new download of it costs."""
    quotas: tuple[BindingQuota, ...] = ()
    """The ModelStoreBindings of the artifact's namespace (added within v1)."""

    @property
    def hub(self) -> tuple[str, str] | None:
        """``(hub kind, repository)``: ``huggingface`` or ``modelscope`` (the names of
        :mod:`hub.kinds`); None when the record names no hub source."""
        if self.model_scope is not None:
            return ("modelscope", self.model_scope.repository)
        if self.source is not None:
            return ("huggingface", self.source.repository)
        return None

    @property
    def resolved(self) -> bool:
        """Pinned to a digest and a commit (or to its ``expectedDigest`` alone, which only peers
        can fill): only then may a volume mount it.

        Derived, not sent: the control plane only writes what it pinned in ``status.resolved``,
        so a separate flag could only disagree with it.
        """
        return self.manifest_digest is not None and (
            self.revision is not None or self.digest_source == "Expected"
        )


class PendingContainer(_Record, frozen=True, kw_only=True):
    """One container's claim of one sliced or partitioned resource, as the admission folded it."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    resource: str
    """The device-plugin resource name the claim asks kubelet for (``nvidia.com/gpu.sliced``)."""
    count: int = 1
    """How many devices of ``resource`` the container asks for (kubelet's Allocate size)."""
    units: int
    """The container's ``<resource>.units`` limit: what the ledger charges per card. For an
    exclusive or shared claim the cards' units (count × 1,600,000, or × 160,000 shared); 0 for
    a visibility claim, which charges nothing."""
    memory_percentage: int | None = None
    memory_mib: int | None = None
    cores_percentage: int | None = None
    profile: str | None = None
    """The partition profile (``3g.40gb``) of a partitioned claim."""
    created_at: datetime
    """The Pod's ``metadata.creationTimestamp``: the oldest feasible container is served first."""


class PendingContainers(_Record, frozen=True, kw_only=True):
    """Every pending container of one node (written whole: the record replaces the last one)."""

    node: str
    containers: tuple[PendingContainer, ...] = ()

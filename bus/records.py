"""What the control plane pushes to a node's model plugin, as typed records on the bus KV.

Two records, both written only by the control plane and read by the plugin:

- :class:`StoreSpec`, one per node: the NodeModelStore ``spec`` the plugin must follow
  (watermarks, download limits, Hub endpoint). Invalid values are refused by :meth:`validate`,
  and a plugin holding an invalid spec downloads and collects nothing.
- :class:`ArtifactRecord`, one per namespace and ModelArtifact: what authorizes a volume. Only
  resolved hub artifacts are useful; the record says so explicitly rather than by absence, so
  the plugin can name the rule a volume broke.

Field names are camelCase on the wire, like the CRDs they mirror.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

__all__ = [
    "ArtifactRecord",
    "Download",
    "HubEndpoint",
    "Source",
    "StoreSpec",
    "Watermarks",
]


_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")


def is_digest(value: str) -> bool:
    """Whether ``value`` is ``sha256:`` and 64 lowercase hex digits (a manifest digest)."""
    return _DIGEST.fullmatch(value) is not None


class _Record(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=False
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


class HubEndpoint(_Record, frozen=True, kw_only=True):
    hugging_face_endpoint: str | None = None
    """None: the plugin's own default (``HF_ENDPOINT``, else https://huggingface.co)."""
    https_proxy: str | None = None
    no_proxy: str | None = None
    ca_bundle: str | None = None
    """PEM text of extra CAs (the worker reads the ConfigMap and inlines it)."""


class StoreSpec(_Record, frozen=True, kw_only=True):
    """A node's NodeModelStore ``spec`` as the worker computed it."""

    watermarks: Watermarks = Watermarks()
    download: Download = Download()
    hub: HubEndpoint = HubEndpoint()
    pinned: tuple[str, ...] = ()
    """Digests never collected (ModelPrefetch retention)."""
    generation: int = 0
    """The NodeModelStore's ``metadata.generation`` this spec is (status.observedGeneration)."""

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
        endpoint = self.hub.hugging_face_endpoint
        if endpoint is not None and not endpoint.startswith(("https://", "http://")):
            found.append("hub.huggingFaceEndpoint is not an http(s) URL")
        found.extend(f"pinned {p!r} is not a digest" for p in self.pinned if not is_digest(p))
        return found


class Source(_Record, frozen=True, kw_only=True):
    hub: Literal["huggingFace", "modelScope", "persistentVolumeClaim", "image"] = "huggingFace"
    repository: str = ""
    revision: str = "main"


class ArtifactRecord(_Record, frozen=True, kw_only=True):
    """A ModelArtifact as the node plugin needs it to authorize and materialize a volume."""

    namespace: str
    name: str
    uid: str
    source: Source
    resolved: bool = False
    """The ``Resolved`` condition is True and ``status.resolved`` is set."""
    manifest_digest: str | None = None
    """``status.resolved.manifestDigest``."""
    commit: str | None = None
    """``status.resolved.revision``: the 40-hex commit the digest was listed at."""
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    secret_name: str | None = None
    """``spec.source.*.secretRef.name``; the token itself reaches the plugin through the CSI
    ``nodePublishSecretRef`` (the Pod's namespace), never through the bus."""

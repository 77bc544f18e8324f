"""The one table of pinned upstream releases the worker installs (``PINS``).

Each pin names the release's version, the URL of its rendered release manifest (one
multi-document YAML file) and the SHA-256 of that file. The worker applies a manifest only when its
bytes hash to the pinned checksum, wherever they came from (the URL, or a mirror directory for
air-gapped clusters), so a pin is the whole trust decision; changing the version, URL and checksum
together here is how an application is upgraded.

Checksums that could not be verified when the table was written are ``None``: such a pin is
refused (a clear ``unpinned`` outcome and log line, nothing applied) rather than trusted blindly.
Nothing here was invented: a ``None`` says which facts are missing.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["PINS", "Pin"]


class Pin(msgspec.Struct, frozen=True, kw_only=True):
    """One application's pinned release. Invariant: ``file`` is the name a mirror holds it under
    (``<mirror>/<name>/<version>/<file>``)."""

    name: str
    version: str
    url: str | None
    """The release manifest upstream; None: upstream publishes no single rendered file (mirror
    only, built from the release as the comment in ``PINS`` says)."""
    sha256: str | None
    """Lower-case hex SHA-256 of the manifest; None: not verified yet (the pin is refused)."""
    file: str = "manifests.yaml"
    build: str = ""
    """How to produce the file where upstream publishes none (``url`` None): what a refusal
    tells the operator to mirror."""


# Checksums: none of these could be verified from this build environment (no network to the
# upstream release sites, no published checksum in the reference material, and no package found on
# PyPI, npm or Debian carries these release manifests), so each is None and its pin is refused
# until a maintainer records the sha256 of the downloaded file (`sha256sum`); the refusal says
# how (manifests.how_to_pin). The URLs follow each project's published release layout.
PINS: Final[dict[str, Pin]] = {
    p.name: p
    for p in (
        # Kueue publishes its rendered manifest as a release asset; the chain needs v1beta2
        # (v0.16 or later, see deploy/overlays/kueue).
        Pin(
            name="kueue",
            version="v0.16.0",
            url="https://github.com/kubernetes-sigs/kueue/releases/download/v0.16.0/manifests.yaml",
            sha256=None,
        ),
        # NFD ships kustomize overlays, not one file.
        Pin(
            name="node-feature-discovery",
            version="v0.17.3",
            url=None,
            sha256=None,
            build="the output of `kubectl kustomize https://github.com/kubernetes-sigs/"
            "node-feature-discovery/deployment/overlays/default?ref=v0.17.3`",
        ),
        # csi-driver-nfs ships per-version directories of files.
        Pin(
            name="csi-driver-nfs",
            version="v4.11.0",
            url=None,
            sha256=None,
            build="the concatenation of csi-driver-nfs's deploy/v4.11.0/*.yaml",
        ),
        # k8s-csi-s3 ships deploy/kubernetes/*.yaml per tag.
        Pin(
            name="csi-driver-s3",
            version="v0.43.0",
            url=None,
            sha256=None,
            build="the concatenation of k8s-csi-s3's deploy/kubernetes/*.yaml at tag v0.43.0",
        ),
    )
}

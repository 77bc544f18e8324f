"""The model hubs (Hugging Face, ModelScope) as both sides of the system use them: clients,
manifest, records.

A package of its own, beside ``bus``, because the control plane resolves ModelArtifacts with the
same code the node plugin verifies downloads with: one implementation means one digest. Of the
bus it uses only :func:`bus.records.is_digest` (the records the control plane pushes to nodes
carry digests, and the bus may not import the hub).

Modules: ``client`` (the Hub client), ``resolving`` (a repository at a revision into its
``manifest``), ``http``, ``framing`` and ``urls`` (a small HTTP/1.1 client and what it fetches),
``endpoints`` (where the Hub is, which names may be sent), ``errors``, ``testing`` (a fake Hub);
ModelScope: ``modelscope`` (its client), ``modelscope_env`` (its environment), ``kinds`` (the
one huggingface/modelscope choice), ``testing_modelscope`` (a fake ModelScope).
"""

from __future__ import annotations

from hub.errors import HubError
from hub.manifest import Entry, Manifest
from hub.resolving import resolve

__all__ = ["Entry", "HubError", "Manifest", "resolve"]

"""The Hugging Face Hub as both sides of the system use it: client, manifest, records.

``bus`` rather than ``agent`` because the control plane resolves ModelArtifacts with the same
code the node plugin verifies downloads with; one implementation means one digest.
"""

from __future__ import annotations

from bus.hub.errors import HubError
from bus.hub.manifest import Entry, Manifest
from bus.hub.resolving import resolve

__all__ = ["Entry", "HubError", "Manifest", "resolve"]

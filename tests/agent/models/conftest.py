"""Fixtures of the model plugin tests; the harness itself is in models_harness.py."""

from __future__ import annotations

from models_harness import anyio_backend, can_mount, mounts, rig

__all__ = ["anyio_backend", "can_mount", "mounts", "rig"]

"""Fixtures of the model plugin tests; the harness itself is in models_harness.py."""

from __future__ import annotations

from models_harness import can_mount, mounts, rig

__all__ = ["can_mount", "mounts", "rig"]

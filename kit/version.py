"""The installed package's version, as every process reports it (agent events, CSI, logs)."""

from __future__ import annotations

from importlib import metadata

__all__ = ["package_version"]


def package_version() -> str:
    """The version of the installed ``gpustack-operator`` distribution (``0.0.0`` from a tree)."""
    try:
        return metadata.version("gpustack-operator")
    except metadata.PackageNotFoundError:
        return "0.0.0"

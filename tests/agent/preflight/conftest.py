"""Fixtures of the preflight tests; the host-root machinery lives in :mod:`preflight_hosts`."""

from __future__ import annotations

from preflight_hosts import host, lib_source

__all__ = ["host", "lib_source"]

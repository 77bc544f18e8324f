"""Fixtures for the deployment tests: every rendered tree, once per session."""

from __future__ import annotations

from typing import Any

import pytest
from deploy_helpers import REPO, TREES, render


@pytest.fixture(scope="session")
def trees() -> dict[str, list[dict[str, Any]]]:
    """Every kustomization (the base and each overlay) → its rendered objects."""
    return {t: render.build(REPO / t) for t in TREES}


@pytest.fixture(scope="session")
def base(trees: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return trees["deploy"]

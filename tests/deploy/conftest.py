"""Fixtures for the deployment tests: every kustomization root, built by ``kubectl kustomize``."""

from __future__ import annotations

from typing import Any

import pytest
from deploy_helpers import BASE, TREES, build


@pytest.fixture(scope="session")
def trees() -> dict[str, list[dict[str, Any]]]:
    """Every kustomization root (the base, the CRDs, each overlay) → its built objects."""
    return {t: build(t) for t in TREES}


@pytest.fixture(scope="session")
def base(trees: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return trees[BASE]

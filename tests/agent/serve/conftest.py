"""Fixtures for the ``dm serve`` tests; the fake kubelet itself lives in ``serve_harness``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_harness import Kubelet


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Kubelet]:
    fake = Kubelet(tmp_path / "kubelet.sock")
    yield fake
    fake.stop()

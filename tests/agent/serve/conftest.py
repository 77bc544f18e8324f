"""Fixtures for the ``dm serve`` tests; the fake kubelet itself lives in ``agent.testing``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.testing import FakeKubelet, fake_kubelet


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with fake_kubelet(tmp_path / "kubelet.sock") as fake:
        yield fake

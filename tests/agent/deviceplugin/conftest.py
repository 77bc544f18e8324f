"""Fixtures of the device-plugin tests: simulated groups (``deviceplugin_harness``) and the grpcio fake kubelet (``agent.testing``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from deviceplugin_harness import simulated

from agent.testing import FakeKubelet, fake_kubelet
from bus import devices


@pytest.fixture(scope="session")
def h200() -> list[devices.DeviceGroup]:
    return simulated("nvidia", "nvidia-h200x8")


@pytest.fixture(scope="session")
def rx7800() -> list[devices.DeviceGroup]:
    return simulated("amd", "amd-rx7800xt-x2")


@pytest.fixture(scope="session")
def h100_mig() -> list[devices.DeviceGroup]:
    return simulated("nvidia", "nvidia-h100x8-mig")


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with fake_kubelet(tmp_path / "kubelet.sock") as fake:
        yield fake

"""Fixtures for bus tests: a real nats-server per test, on free loopback ports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bus import connection, testing
from bus.embedded import ServerProcess
from bus.metrics import BusMetrics
from bus.settings import BusSettings


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    async with testing.nats_server(tmp_path) as s:
        yield s


@pytest.fixture
def settings(server: ServerProcess) -> BusSettings:
    return testing.settings_for(server)


@pytest.fixture
def metrics() -> BusMetrics:
    return BusMetrics()


@pytest.fixture
async def conn(settings: BusSettings) -> AsyncIterator[connection.Connection]:
    async with connection.connect(settings, retry=False) as c:
        yield c

"""The small shared kits: named long-lived tasks, and typed flag reads."""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import pytest

from kit.options import Options
from kit.tasks import start_forever

pytestmark = pytest.mark.anyio


async def test_a_long_lived_task_that_returns_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    async def finishes() -> None:
        await anyio.lowlevel.checkpoint()

    with caplog.at_level(logging.ERROR, logger="kit.tasks"):
        async with anyio.create_task_group() as tg:
            start_forever(tg, "resync", finishes)
    assert [r.getMessage() for r in caplog.records] == [
        "resync stopped on its own; it should run until the process stops"
    ]


async def test_a_cancelled_long_lived_task_is_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="kit.tasks"):
        async with anyio.create_task_group() as tg:
            start_forever(tg, "watch", anyio.sleep_forever)
            await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert caplog.records == []


def test_options_read_typed_values_and_record_them() -> None:
    options = Options({"node_name": "n1", "secure_port": 443, "no_shared": True, "tags": ("a",)})
    assert options.text("node-name") == "n1"
    assert options.integer("secure-port") == 443
    assert options.number("secure-port") == 443.0
    assert options.switch("no-shared") is True
    assert options.items("tags") == ("a",)
    assert options.read == {"node-name", "secure-port", "no-shared", "tags"}


def test_options_refuse_unknown_flags_and_wrong_types() -> None:
    options = Options({"no_shared": True, "name": ""})
    with pytest.raises(KeyError, match="--missing"):
        options.text("missing")
    with pytest.raises(TypeError, match="--no-shared"):
        options.integer("no-shared")
    assert options.optional_text("name") is None
    assert options.read == {"name"}

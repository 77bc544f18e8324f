"""The small shared kits: named long-lived tasks, and typed flag reads."""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import pytest

from kit.options import Flags, Options
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


class _Some(Flags, frozen=True, kw_only=True):
    node_name: str
    secure_port: int
    no_shared: bool
    tags: tuple[str, ...]


class _Period(Flags, frozen=True, kw_only=True):
    resync_period: float


def test_options_read_typed_structs_and_count_each_flag() -> None:
    values = {"node_name": "n1", "secure_port": 443, "no_shared": True, "tags": ("a",)}
    options = Options({**values, "resync_period": 5, "unread": ""})
    flags = options.read_flags(_Some)
    assert (flags.node_name, flags.secure_port, flags.no_shared, flags.tags) == (
        "n1", 443, True, ("a",),
    )  # fmt: skip
    assert options.read_flags(_Period).resync_period == 5.0  # an integer is a number
    options.read_flags(_Period)
    assert options.reads == {
        "node-name": 1, "secure-port": 1, "no-shared": 1, "tags": 1, "resync-period": 2,
    }  # fmt: skip
    assert options.read == {"node-name", "secure-port", "no-shared", "tags", "resync-period"}


def test_options_refuse_missing_flags_and_wrong_types() -> None:
    with pytest.raises(KeyError, match="--secure-port"):
        Options({"node_name": "n", "no_shared": True, "tags": ()}).read_flags(_Some)
    wrong = Options({"node_name": "n", "secure_port": True, "no_shared": True, "tags": ()})
    with pytest.raises(TypeError, match="secure_port"):
        wrong.read_flags(_Some)  # a bool is not an int
    assert wrong.reads == {}  # a refused read counts nothing

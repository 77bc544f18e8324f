"""The rule of tests/conftest.py: an async test runs on uvloop, and on asyncio too when marked
``every_loop``; a synchronous test is not parametrized by a loop at all."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.anyio

ON_UVLOOP = sys.platform != "win32"


def _running_uvloop() -> bool:
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")


async def test_an_unmarked_async_test_runs_once_on_the_production_loop(
    request: pytest.FixtureRequest,
) -> None:
    assert _running_uvloop() == ON_UVLOOP
    assert not hasattr(request.node, "callspec")  # one run: no loop parameter


@pytest.mark.every_loop
async def test_a_marked_async_test_runs_on_each_loop(
    anyio_backend: Any, request: pytest.FixtureRequest
) -> None:
    loop_id = request.node.callspec.id
    assert loop_id in ("asyncio", "uvloop")
    assert _running_uvloop() == (loop_id == "uvloop")
    assert (anyio_backend == "asyncio") == (loop_id == "asyncio")


def test_both_loops_of_the_marked_test_were_collected(request: pytest.FixtureRequest) -> None:
    names = {item.name for item in request.session.items if item.module is sys.modules[__name__]}
    marked = "test_a_marked_async_test_runs_on_each_loop"
    expected = {f"{marked}[asyncio]", f"{marked}[uvloop]"} if ON_UVLOOP else {f"{marked}[asyncio]"}
    assert {n for n in names if n.startswith(marked)} == expected
    assert "test_an_unmarked_async_test_runs_once_on_the_production_loop" in names

"""Fixtures every test shares: the event loops async tests run on.

Every ``anyio`` test runs twice: on the plain asyncio loop and on uvloop, the loop the services
run on in production (``anyio.run(..., backend_options={"use_uvloop": True})``). The two differ
in timing, in thread hand-offs and in what they let through unchecked; a test that passes on one
loop only is a bug in the test or in the code.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

LOOPS: list[Any] = [pytest.param("asyncio", id="asyncio")]
if sys.platform != "win32":
    LOOPS.append(pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"))


@pytest.fixture(scope="module", params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param

"""Request bounds: pure checks, measured once and never quoting more than a few dozen chars."""

from __future__ import annotations

import pytest

from agent.deviceplugin import errors, limits


def test_ordinary_requests_pass() -> None:
    limits.check_requests("nvidia.com/gpu", [["nvidia-h200:GPU-1:0000"], []])


@pytest.mark.parametrize(
    ("id_lists", "needle"),
    [
        ([["a"]] * (limits.MAX_CONTAINERS + 1), "container requests"),
        ([["a"] * (limits.MAX_IDS + 1)], "more than 4096 device ids"),
        ([["a" * (limits.MAX_ID_BYTES + 1)]], "at most 256"),
    ],
)
def test_out_of_bounds_requests_are_refused(id_lists: list[list[str]], needle: str) -> None:
    with pytest.raises(errors.BadRequest, match=needle) as info:
        limits.check_requests("nvidia.com/gpu", id_lists)
    assert len(str(info.value)) < 200


def test_a_shown_id_is_cut() -> None:
    assert limits.shown("abc") == "'abc'"
    assert limits.shown("x" * 1000) == repr("x" * limits.SHOWN_CHARS) + "…"

"""The one parser per type (``kit.values``) against Go's and Kubernetes' behaviour.

The reference is Go's own: the duration table is the cases Go's ``time`` package documents and
tests for ``ParseDuration`` (results as Go prints them), the boolean forms are
``strconv.ParseBool``'s list, the integer rule ``strconv.ParseInt(s, 10, 64)``'s. Property tests
compare each parser with an independent model over generated texts.
"""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kit import values
from kit.values import InvalidValue

NS, US, MS, S, M, H = 1, 10**3, 10**6, 10**9, 60 * 10**9, 3600 * 10**9


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0), ("5s", 5 * S), ("30s", 30 * S), ("1478s", 1478 * S), ("-5s", -5 * S),
        ("+5s", 5 * S), ("-0", 0), ("+0", 0), ("5.0s", 5 * S), ("5.6s", 5600 * MS),
        ("5.s", 5 * S), (".5s", 500 * MS), ("1.004s", 1004 * MS), ("100.00100s", 100001 * MS),
        ("10ns", 10), ("11us", 11 * US), ("12µs", 12 * US), ("12μs", 12 * US), ("13ms", 13 * MS),
        ("15m", 15 * M), ("16h", 16 * H), ("3h30m", 210 * M), ("10.5s4m", 250500 * MS),
        ("-2m3.4s", -123400 * MS), ("1h2m3s4ms5us6ns", H + 2 * M + 3 * S + 4 * MS + 5 * US + 6),
        ("39h9m14.425s", 39 * H + 9 * M + 14425 * MS), ("52763797000ns", 52763797000),
        ("0.3333333333333333333h", 20 * M),  # float64 scaling, as Go: not 1 ns less
        ("9007199254740993ns", 9007199254740993), ("9223372036854775807ns", 2**63 - 1),
        ("9223372036854775.807us", 2**63 - 1), ("9223372036s854ms775us807ns", 2**63 - 1),
        ("-9223372036854775808ns", -(2**63)), ("-9223372036854775.808us", -(2**63)),
        ("0.100000000000000000000h", 6 * M), ("0.830103483285477580700h", 49 * M + 48372539827),
    ],
)  # fmt: skip
def test_durations_as_go_reads_them(text: str, ns: int) -> None:
    assert values.parse_duration_ns(text) == ns
    assert values.parse_duration(text) == ns / 1e9


@pytest.mark.parametrize(
    "text",
    [
        "", "3", "-", "s", ".", "-.", ".s", "+.s", "1d", "\x85\x85", "hello \uffff world",
        "9223372036854775808ns", "9223372036854775.808us", "9223372036854ms775us808ns",
        "-9223372036854775809ns", " 1s", "1s ", "1 s", "1_0s", "１s", "1h" * 40, "30",
    ],
)  # fmt: skip
def test_what_go_refuses_as_a_duration(text: str) -> None:
    with pytest.raises(InvalidValue, match="duration"):
        values.parse_duration_ns(text)


_UNITS = {"ns": NS, "us": US, "µs": US, "μs": US, "ms": MS, "s": S, "m": M, "h": H}


@settings(deadline=None)  # a loaded machine is no failure: no timing here
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**5), st.one_of(st.none(), st.text("0123456789", max_size=6)),
            st.sampled_from(sorted(_UNITS)),
        ),
        min_size=1, max_size=4,
    ),
    st.sampled_from(["", "+", "-"]),
)  # fmt: skip
def test_a_generated_duration_is_its_exact_sum(
    parts: list[tuple[int, str | None, str]], sign: str
) -> None:
    """Within float64's exact range Go's result is the exact sum, truncated: model it so."""
    text = sign + "".join(
        f"{whole}{'' if frac is None else '.' + frac}{unit}" for whole, frac, unit in parts
    )
    exact = sum(
        (Fraction(f"{whole}.{frac or '0'}") * _UNITS[unit] for whole, frac, unit in parts),
        Fraction(0),
    )
    got = values.parse_duration_ns(text)
    # Each fraction is scaled in float64 and truncated on its own: at most 1 ns off per part.
    assert abs(abs(got) - exact) < len(parts)
    assert got == 0 or (got < 0) == (sign == "-")


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_go_true_forms(text: str) -> None:
    assert values.parse_bool(text) is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_go_false_forms(text: str) -> None:
    assert values.parse_bool(text) is False


@settings(deadline=None)  # a loaded machine is no failure: no timing here
@given(st.text(max_size=8))
def test_nothing_else_is_a_boolean(text: str) -> None:
    forms = {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}
    if text in forms:
        assert values.parse_bool(text) is (text in {"1", "t", "T", "TRUE", "true", "True"})
    else:
        with pytest.raises(InvalidValue):
            values.parse_bool(text)


@pytest.mark.parametrize(
    "text", [" 8", "8 ", "０８", "８", "1_6", "0x10", "", "+", "-", "1.0", "1e3", "٣", "\t8"]
)
def test_what_go_refuses_as_an_integer(text: str) -> None:
    with pytest.raises(InvalidValue, match="not an integer"):
        values.parse_int(text)


def _parse_int_model(text: str) -> int | None:
    """strconv.ParseInt(s, 10, 64), written from its rules: sign, ASCII digits, int64."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or any(c not in "0123456789" for c in body):
        return None
    value = int(body) * (-1 if text.startswith("-") else 1)
    return value if -(2**63) <= value < 2**63 else None


@settings(deadline=None)  # a loaded machine is no failure: no timing here
@given(
    st.one_of(
        st.text(max_size=24),
        st.integers(-(2**64), 2**64).map(str),
        st.builds(
            lambda sign, digits: sign + digits,
            st.sampled_from(["", "+", "-", " ", "_"]), st.text("0123456789_ ٣８", max_size=21),
        ),
    )
)  # fmt: skip
def test_integers_follow_the_model(text: str) -> None:
    expected = _parse_int_model(text)
    if expected is None:
        with pytest.raises(InvalidValue):
            values.parse_int(text)
    else:
        assert values.parse_int(text) == expected


def test_integer_bounds_are_inclusive() -> None:
    assert values.parse_int("64", 1, 64) == 64
    with pytest.raises(InvalidValue, match=r"\[1, 64\]"):
        values.parse_int("65", 1, 64)


@pytest.mark.parametrize("text", ["inf", "nan", "-Infinity", "1_0", " 1", "0x1p3", "１", "1e999"])
def test_what_is_no_float(text: str) -> None:
    with pytest.raises(InvalidValue):
        values.parse_float(text)


@settings(deadline=None)  # a loaded machine is no failure: no timing here
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_reads_back_as_python_prints_it(number: float) -> None:
    assert values.parse_float(repr(number)) == number


@settings(deadline=None)  # a loaded machine is no failure: no timing here
@given(st.text(max_size=12))
def test_a_quantity_never_holds_a_space_or_foreign_digit(text: str) -> None:
    if re.search(r"\s|_", text) or any(c.isdigit() and not c.isascii() for c in text):
        with pytest.raises(InvalidValue):
            values.parse_quantity(text)


def test_texts_are_bounded_at_their_limits() -> None:
    assert values.bounded("a" * 4096) == "a" * 4096
    with pytest.raises(InvalidValue, match="at most 4096"):
        values.bounded("a" * 4097)
    assert values.bounded("u" * 2048, values.MAX_URL, "URL") == "u" * 2048
    with pytest.raises(InvalidValue, match="URL too long: 2049"):
        values.bounded("u" * 2049, values.MAX_URL, "URL")

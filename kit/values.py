"""One parser per value type: what settings, command-line flags and webhooks accept (pure).

The people who configure this operator write Kubernetes objects and Go command lines, so a value
means here what it means to Go's ``strconv``/``time`` and to Kubernetes, exactly, in every place
a text becomes a typed value (the ``Setting`` catalog, the flags, the admission webhooks):

- **int**: ``strconv.ParseInt(s, 10, 64)``: an optional ``+``/``-`` then ASCII digits ``0-9``,
  nothing else (no space, no ``_``, no other script's digits such as ``０８``), within int64;
- **bool**: ``strconv.ParseBool``: ``1 t T TRUE true True`` and ``0 f F FALSE false False``;
  nothing else (``yes``, ``on``, `` true`` are refused);
- **float**: the decimal form of ``strconv.ParseFloat(s, 64)``: ``[+-]digits[.digits][e[+-]digits]``,
  finite (no ``inf``/``nan``, no hexadecimal, no ``_``);
- **duration**: ``time.ParseDuration``: an optional sign, then one or more ``<number><unit>``
  with units ``ns us µs μs ms s m h`` (``1h30m``, ``1.5s``, ``.5m``); ``0`` alone is the only
  unitless form; kept to the nanosecond (a fraction finer than that is cut), within int64
  nanoseconds (about 292 years);
- **quantity**: a Kubernetes ``resource.Quantity`` (``400k``, ``1.5Gi``, ``16e4``), exact;
- **text**: at most :data:`MAX_TEXT` characters; a **URL** at most :data:`MAX_URL` (the length
  browsers, proxies and most servers accept).

Every parser raises :class:`InvalidValue` (a ``ValueError``) with a one-line reason that never
repeats the text: the caller names the setting or flag and decides whether the text may be shown.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # imported where a quantity is parsed: a command that parses none skips it
    from fractions import Fraction

__all__ = [
    "MAX_TEXT",
    "MAX_URL",
    "InvalidValue",
    "bounded",
    "excerpt",
    "parse_bool",
    "parse_duration",
    "parse_duration_ns",
    "parse_float",
    "parse_int",
    "parse_quantity",
]

MAX_TEXT: Final = 4096
"""The longest value any setting or flag takes (a no-proxy list is the longest real one)."""
MAX_URL: Final = 2048
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

_ASCII_INT: Final = re.compile(r"[+-]?[0-9]+")
_ASCII_FLOAT: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_UNIT_NS: Final = {
    "ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 10**9,
    "m": 60 * 10**9, "h": 3600 * 10**9,
}  # fmt: skip
_COMPONENT: Final = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_QUANTITY: Final = re.compile(
    r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))([eE][+-]?[0-9]{1,2}|[KMGTPE]i|[numkMGTPE])?"
)
_SUFFIX: Final[dict[str, tuple[int, int]]] = {
    "n": (1, 10**9), "u": (1, 10**6), "m": (1, 1000), "": (1, 1),
    "k": (10**3, 1), "M": (10**6, 1), "G": (10**9, 1), "T": (10**12, 1),
    "P": (10**15, 1), "E": (10**18, 1),
    "Ki": (2**10, 1), "Mi": (2**20, 1), "Gi": (2**30, 1), "Ti": (2**40, 1),
    "Pi": (2**50, 1), "Ei": (2**60, 1),
}  # fmt: skip
"""Each suffix's factor as a fraction (numerator, denominator): :mod:`fractions` is imported
only when a quantity is parsed (it cost every command's start-up several ms)."""
_MAX_NUMBER: Final = 64
"""Digits beyond this are no real configuration (and bound the work of a hostile text)."""


class InvalidValue(ValueError):
    """The text is no value of the type (the message says why, never quoting the text)."""


def bounded(text: str, limit: int = MAX_TEXT, what: str = "value") -> str:
    """``text`` when it has at most ``limit`` characters. :raises InvalidValue: longer."""
    if len(text) > limit:
        raise InvalidValue(f"{what} too long: {len(text)} characters (at most {limit})")
    return text


def excerpt(text: str, limit: int = 100) -> str:
    """``text`` as an error message may quote it: its first ``limit`` characters and ``…`` (a
    refused megabyte is never echoed into a log line, an exit line or an API answer)."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def parse_int(text: str, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """A base-10 int64 as ``strconv.ParseInt(text, 10, 64)`` reads it, within ``[low, high]``."""
    if len(text) > _MAX_NUMBER or not _ASCII_INT.fullmatch(text):
        raise InvalidValue("not an integer (ASCII digits 0-9, an optional sign, nothing else)")
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidValue("out of the int64 range")
    if not low <= value <= high:
        raise InvalidValue(f"must be within [{low}, {high}]")
    return value


def parse_bool(text: str) -> bool:
    """A boolean as ``strconv.ParseBool`` reads it."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidValue(
        "not a boolean (true or false; also 1, t, TRUE, True and 0, f, FALSE, False)"
    )


def parse_float(text: str) -> float:
    """A finite decimal float (``strconv.ParseFloat``'s decimal form, no inf/nan)."""
    if len(text) > _MAX_NUMBER or not _ASCII_FLOAT.fullmatch(text):
        raise InvalidValue("not a decimal number (e.g. 2, 0.5, 1e3)")
    value = float(text)
    if not math.isfinite(value):
        raise InvalidValue("must be a finite number")
    return value


def parse_duration_ns(text: str) -> int:
    """A Go duration (``time.ParseDuration``), in whole nanoseconds.

    Go's own arithmetic, step for step: whole parts in integers, a fraction's digits beyond
    int64 dropped, the fraction scaled in float64 and truncated, every overflow an error; so that
    ``0.3333333333333333333h`` is exactly 20m as Go says, not 1 ns less.
    """
    if len(text) > _MAX_NUMBER:
        raise InvalidValue("not a duration: too long")
    negative = text[:1] == "-"
    body = text[1:] if text[:1] in ("+", "-") else text
    if body == "0":
        return 0
    if not body:
        raise InvalidValue("not a duration (e.g. 90s, 1h30m, 500ms)")
    total, pos = 0, 0
    while pos < len(body):
        total, pos = _component(body, pos, total)
    if total > INT64_MAX + (1 if negative else 0):
        raise InvalidValue(_OVERFLOW)
    return -total if negative else total


_OVERFLOW: Final = "duration out of range (about 292 years at most)"
_LIMIT: Final = 1 << 63


def _component(body: str, pos: int, total: int) -> tuple[int, int]:
    """One ``<number><unit>`` of a duration from ``pos``: the new total and the next position."""
    match = _COMPONENT.match(body, pos)
    assert match is not None  # every part is optional: it always matches
    whole, fraction, unit = match.groups()
    if not whole and not fraction:
        raise InvalidValue("not a duration (e.g. 90s, 1h30m, 500ms)")
    if unit not in _UNIT_NS:
        reason = "missing unit" if not unit else "unknown unit"
        raise InvalidValue(f"not a duration: {reason} (ns, us, ms, s, m, h)")
    value = int(whole or "0")
    numerator, scale = 0, 1.0  # the scale is a float64 in Go, multiplied by 10 at each digit
    for digit in fraction or "":
        if numerator > (_LIMIT - 1) // 10 or numerator * 10 + int(digit) > _LIMIT:
            break  # Go keeps the digits that fit and ignores the rest
        numerator, scale = numerator * 10 + int(digit), scale * 10
    per_unit = _UNIT_NS[unit]
    if value > _LIMIT // per_unit:
        raise InvalidValue(_OVERFLOW)
    value *= per_unit
    if numerator:
        value += int(float(numerator) * (float(per_unit) / scale))
    total += value
    if value > _LIMIT or total > _LIMIT:
        raise InvalidValue(_OVERFLOW)
    return total, match.end()


def parse_duration(text: str) -> float:
    """A Go duration (``time.ParseDuration``), in seconds."""
    return parse_duration_ns(text) / 1e9


def parse_quantity(value: str | int) -> Fraction:
    """A Kubernetes quantity's exact value (``400k``, ``1.5Gi``, ``16e4``, ``-2m``).

    The API server re-serializes quantities in their canonical form, so ``1600000`` arrives as
    ``1600k``: the suffixes must be read. No space is allowed, as ``resource.ParseQuantity``.
    """
    from fractions import Fraction

    if isinstance(value, int):
        return Fraction(value)
    match = _QUANTITY.fullmatch(value) if len(value) <= _MAX_NUMBER else None
    if match is None:
        raise InvalidValue("not a quantity (e.g. 400k, 1.5Gi, 16e4)")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix not in _SUFFIX:  # a decimal exponent (``E`` alone is exa, ``Ei`` exbi)
        return Fraction(number) * Fraction(10) ** int(suffix[1:])
    return Fraction(number) * Fraction(*_SUFFIX[suffix])

"""Go-style flags: what the reference binary accepts, parsed without importing any command.

The binary is used by people who know kubectl and klog, so flags behave as Go's do: ``-flag`` and
``--flag`` are the same, ``--flag=value`` and ``--flag value`` both work, a boolean flag alone means
true and takes a value only after ``=`` (``--no-shared=false``), values read as Go reads them, by the
one parser per type of :mod:`kit.values` (settings and webhooks use it too): integers are ASCII
digits (``strconv.ParseInt``), booleans ``strconv.ParseBool``'s forms, durations
``time.ParseDuration``'s (``15s``/``5m``/``1h``; a bare number is refused, ``0`` alone aside).

Every flag can also come from the environment as ``GPUSTACK_<FLAG>`` (upper case, dashes to
underscores); the command line wins. :func:`parse` returns where each value came from, so
``--print-cmdline`` can show the effective command line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kit import values as parsers
from kit.redaction import REDACTED, redact_urls

Kind = Literal["bool", "str", "int", "float", "duration", "list"]


class FlagError(ValueError):
    """The command line or environment holds a flag that is unknown or has a bad value."""


@dataclass(frozen=True)
class Flag:
    name: str
    default: str
    help: str
    kind: Kind = "str"
    short: str | None = None
    choices: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None
    """Inclusive range of an ``int``, ``float`` or ``duration`` value (durations in seconds)."""
    inert: bool = False
    """Accepted for compatibility with the reference command line and read by nothing here;
    ``--help`` says so. Every other flag is read by its command's settings (a test checks)."""
    secret: bool = False
    """A password or token: its value is never printed (``--print-cmdline`` shows REDACTED)."""

    @property
    def env(self) -> str:
        return "GPUSTACK_" + self.name.upper().replace("-", "_")


@dataclass
class Parsed:
    """Parsed values by flag name (typed), positionals, and the flags set explicitly."""

    values: dict[str, object] = field(default_factory=dict)
    positionals: list[str] = field(default_factory=list)
    explicit: dict[str, str] = field(default_factory=dict)
    """Flag name → raw text, for flags given on the command line or in the environment."""
    from_env: set[str] = field(default_factory=set)
    secret: set[str] = field(default_factory=set)
    """Names of the flags marked :attr:`Flag.secret`, whose values are never shown."""
    help: bool = False


def parse_duration(text: str) -> float:
    """A Go duration (``time.ParseDuration``: ``1m30s``, ``15s``, ``500ms``; ``0`` alone), in
    seconds: the one parser settings and webhooks use too (:mod:`kit.values`)."""
    try:
        return parsers.parse_duration(text)
    except parsers.InvalidValue as e:
        raise FlagError(f"invalid duration {text!r}: {e} (use e.g. 15s, 5m, 1h30m)") from e


def parse_bool(text: str) -> bool:
    """A Go boolean (``strconv.ParseBool``), as Go's flag package reads it."""
    try:
        return parsers.parse_bool(text)
    except parsers.InvalidValue as e:
        raise FlagError(f"invalid boolean {text!r} (use true or false)") from e


def convert(flag: Flag, text: str) -> object:
    """Convert one raw value to the flag's type. :raises FlagError: naming the flag."""
    try:
        parsers.bounded(text)
        if flag.choices and text not in flag.choices:
            named = ", ".join(c for c in flag.choices if c)
            raise FlagError(
                f"must be one of {named}" + (" (or empty)" if "" in flag.choices else "")
            )
        if flag.kind == "bool":
            return parsers.parse_bool(text)
        if flag.kind == "list":
            return tuple(part.strip() for part in text.split(",") if part.strip())
        if flag.kind == "str":
            return text
        return _in_bounds(flag, _number(flag, text))
    except (ValueError, FlagError) as e:
        shown = REDACTED if flag.secret else repr(parsers.excerpt(redact_urls(text)))
        raise FlagError(f"invalid value {shown} for --{flag.name}: {e}") from e


def _number(flag: Flag, text: str) -> float:
    if flag.kind == "int":
        return parsers.parse_int(text)
    value = parsers.parse_duration(text) if flag.kind == "duration" else parsers.parse_float(text)
    if flag.kind == "duration" and value < 0:
        raise FlagError("must not be negative")
    return value


def _in_bounds(flag: Flag, value: float) -> float:
    if flag.bounds is not None and not flag.bounds[0] <= value <= flag.bounds[1]:
        low, high = (_plain(b) for b in flag.bounds)
        raise FlagError(f"must be between {low} and {high}")
    return value


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def parse(
    argv: Sequence[str], flags: Sequence[Flag], env: Mapping[str, str] | None = None
) -> Parsed:
    """Parse ``argv`` against ``flags``, then fill unset flags from ``env``, then defaults."""
    by_name = {f.name: f for f in flags}
    by_name.update({f.short: f for f in flags if f.short})
    parsed = Parsed()
    raw: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--":
            parsed.positionals.extend(args)
            break
        if arg in ("-h", "--help", "-help"):
            parsed.help = True
            continue
        if not arg.startswith("-") or arg == "-":
            parsed.positionals.append(arg)
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        flag = by_name.get(name)
        if flag is None:
            raise FlagError(f"unknown flag: {arg.split('=', 1)[0]}")
        if not eq:
            if flag.kind == "bool":
                value = "true"
            elif args:
                value = args.pop(0)
            else:
                raise FlagError(f"flag needs an argument: {arg}")
        if flag.kind == "list" and flag.name in raw:
            value = f"{raw[flag.name]},{value}"  # a repeated list flag accumulates
        raw[flag.name] = value
    _fill(parsed, flags, raw, os.environ if env is None else env)
    return parsed


def _fill(
    parsed: Parsed, flags: Sequence[Flag], raw: dict[str, str], env: Mapping[str, str]
) -> None:
    parsed.secret.update(flag.name for flag in flags if flag.secret)
    for flag in flags:
        text = raw.get(flag.name)
        if text is None and flag.env in env:
            text = env[flag.env]
            parsed.from_env.add(flag.name)
        if text is not None:
            parsed.explicit[flag.name] = text
        parsed.values[flag.name.replace("-", "_")] = convert(
            flag, flag.default if text is None else text
        )


def effective_cmdline(command: Sequence[str], parsed: Parsed) -> str:
    """The command line that reproduces this run without the environment's help.

    It goes to logs, so secrets stay out: a secret flag's value is REDACTED, and so is a
    password inside any URL (``nats://user:REDACTED@host``), wherever the value came from.
    """
    parts = ["gpustack-operator", *command]
    for name in sorted(parsed.explicit):
        if name == "print-cmdline":
            continue
        value = REDACTED if name in parsed.secret else redact_urls(parsed.explicit[name])
        parts.append(f"--{name}={value}")
    parts.extend(parsed.positionals)
    return " ".join(_quote(p) for p in parts)


def _quote(text: str) -> str:
    if text and re.fullmatch(r"[\w@%+=:,./-]+", text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"

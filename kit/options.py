"""A command's parsed flags as every settings builder reads them: by name, typed, accounted for.

The launcher parses the command line into plain values; each command's ``settings_from(options)``
turns them into its one frozen settings object. :class:`Options` is the seam between the two: a
read names the flag as the command table spells it (``"node-name"``), returns the flag's own
type, and is recorded, so a test can prove that every flag a command accepts is read by it (a
flag nothing reads is refused at parse time or says in ``--help`` that it has no effect).

Defaults live in the command table only: reading a flag the command does not have is a
programming error (:class:`KeyError`), never a silent fallback to a second default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

__all__ = ["Options", "SettingsError"]

T = TypeVar("T")


class SettingsError(ValueError):
    """The flags are well formed but do not make a valid configuration (exit 2, one line)."""


class Options:
    """Typed reads of one command's parsed flags, its positionals and the environment."""

    def __init__(
        self,
        values: Mapping[str, object],
        *,
        positionals: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._values = dict(values)
        self.positionals: tuple[str, ...] = tuple(positionals)
        self.env: Mapping[str, str] = env if env is not None else {}
        self.read: set[str] = set()
        """Flag names (as spelled on the command line) read so far."""

    def __contains__(self, name: str) -> bool:
        return _key(name) in self._values

    def text(self, name: str) -> str:
        return self._get(name, str)

    def optional_text(self, name: str) -> str | None:
        """The flag's text, or None when it is empty."""
        return self._get(name, str) or None

    def integer(self, name: str) -> int:
        return self._get(name, int)

    def number(self, name: str) -> float:
        value: float = self._get(name, (int, float))
        return float(value)

    def seconds(self, name: str) -> float:
        """A duration flag, in seconds."""
        return self.number(name)

    def switch(self, name: str) -> bool:
        return self._get(name, bool)

    def items(self, name: str) -> tuple[str, ...]:
        """A list flag: its comma-separated (or repeated) items."""
        value = self._get(name, tuple)
        return tuple(str(v) for v in value)

    def _get(self, name: str, kind: type[T] | tuple[type, ...]) -> T:
        key = _key(name)
        if key not in self._values:
            raise KeyError(f"no flag --{name} on this command")
        value = self._values[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"--{name} holds {type(value).__name__}, not {kind}")
        self.read.add(name)
        return value  # type: ignore[return-value]


def _key(name: str) -> str:
    return name.replace("-", "_")

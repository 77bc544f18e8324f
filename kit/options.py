"""A command's parsed flags as every settings builder reads them: as typed structs, accounted for.

The launcher parses the command line into plain values; each command's ``settings_from(options)``
turns them into its one frozen settings object. :class:`Options` is the seam between the two,
and it has no lookup by flag name: a builder declares the flags it reads as the fields of a
frozen struct (a :class:`Flags` subclass; the field ``node_name`` is ``--node-name``) and reads
them all at once with :meth:`Options.read_flags`. So a misspelt flag is an attribute error
``mypy`` reports before anything runs, a value of the wrong type (a struct field ``int`` for a
``bool`` flag) is refused at the one read, and every read is counted, so a test proves that
every flag a command accepts is read exactly once (a flag nothing reads is refused at parse time
or says in ``--help`` that it has no effect).

Defaults live in the command table only: a struct field has none, and a field the command does
not have is a programming error (:class:`KeyError`), never a silent fallback to a second default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TypeVar

import msgspec

__all__ = ["Flags", "Options", "SettingsError"]


class SettingsError(ValueError):
    """The flags are well formed but do not make a valid configuration (exit 2, one line)."""


class Flags(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the structs that name the flags a builder reads: one field per flag, named as the
    flag with ``_`` for ``-``, typed as the flag's kind reads (``bool``, ``str``, ``int``,
    ``float`` for numbers and durations in seconds, ``tuple[str, ...]`` for lists); no defaults."""


F = TypeVar("F", bound=Flags)


def flag_name(field: str) -> str:
    """The command-line spelling of a :class:`Flags` field (``node_name`` → ``node-name``)."""
    return field.replace("_", "-")


class Options:
    """One command's parsed flags, its positionals and the environment, read as typed structs."""

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
        self.reads: Counter[str] = Counter()
        """Flag names (as spelled on the command line) → how many times they were read."""

    @property
    def read(self) -> set[str]:
        """The flags read so far."""
        return set(self.reads)

    def read_flags(self, kind: type[F]) -> F:
        """The flags ``kind`` names, typed; each read is counted.

        :raises KeyError: the command has no such flag (the struct names one it lacks).
        :raises TypeError: a flag's value is not of the field's type.
        """
        fields = kind.__struct_fields__
        missing = [flag_name(f) for f in fields if f not in self._values]
        if missing:
            raise KeyError(f"no flag --{', --'.join(missing)} on this command")
        try:
            flags = msgspec.convert({f: self._values[f] for f in fields}, kind, strict=True)
        except msgspec.ValidationError as e:
            raise TypeError(
                f"{kind.__name__}: {e} (the flag's kind and the field's type differ)"
            ) from e
        self.reads.update(flag_name(f) for f in fields)
        return flags

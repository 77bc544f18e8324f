"""``--help`` and ``help`` text, laid out as cobra (kubectl's library) lays it out.

Pure text from the command table: a summary, ``Usage:``, ``Aliases:``, ``Examples:``,
``Available Commands:`` and ``Flags:``, each flag with its type placeholder
(``--monitor-period duration``, ``--port int``; a boolean has none), its default, its choices and
its environment variable. Every line fits the terminal's width (``COLUMNS``, else the terminal,
else 80): text is wrapped at spaces and never inside a word, so only a token longer than the
width itself (a path, a URL) may overrun it.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping, Sequence
from typing import Final

from gpustack_operator.commands import ALIASES, COMMANDS, GLOBAL_FLAGS, Command
from gpustack_operator.flags import Flag

__all__ = ["command_help", "group_help", "overview", "placeholder", "width"]

NAME: Final = "gpustack-operator"
DEFAULT_WIDTH: Final = 80
MIN_WIDTH: Final = 40
"""Below this, help is laid out as if the terminal were this wide (words still never split)."""
_PLACEHOLDERS: Final[Mapping[str, str]] = {
    "str": "string",
    "int": "int",
    "float": "float",
    "duration": "duration",
    "list": "strings",
}
_FLAG_COLUMN_MAX: Final = 40
"""A flag's names wider than this put its help on the next line, so the help keeps its room."""
BUILTINS: Final = (
    ("completion", "Print a shell completion script (bash, zsh or fish)."),
    ("help", "Help about any command."),
)
"""Commands of the launcher itself, beside the command table's."""


def width(env: Mapping[str, str] | None = None) -> int:
    """The terminal's width: ``$COLUMNS``, else the terminal's own, else 80; at least 40."""
    if env is not None and env.get("COLUMNS", "").isdigit():
        columns = int(env["COLUMNS"])
    else:
        columns = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return max(MIN_WIDTH, columns)


def placeholder(flag: Flag) -> str:
    """The value's type as cobra prints it after the flag's name; empty for a boolean."""
    return _PLACEHOLDERS.get(flag.kind, "")


def _wrap(text: str, columns: int, indent: str = "", first: str | None = None) -> list[str]:
    return textwrap.wrap(
        text,
        columns,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [(indent if first is None else first).rstrip()]


def _default(flag: Flag) -> str:
    if flag.default in ("", "false") or (flag.kind == "list" and not flag.default):
        return ""
    shown = f'"{flag.default}"' if flag.kind == "str" else flag.default
    return f" (default {shown})"


def _flag_help(flag: Flag) -> str:
    choices = [c for c in flag.choices if c]
    one_of = f" (one of: {', '.join(choices)})" if choices else ""
    inert = " (accepted for compatibility; has no effect yet)" if flag.inert else ""
    return f"{flag.help}{one_of}{_default(flag)}{inert} [${flag.env}]"


def _flag_names(flag: Flag) -> str:
    long = f"-{flag.name}" if len(flag.name) == 1 else f"--{flag.name}"
    names = f"-{flag.short}, {long}" if flag.short else f"    {long}"
    kind = placeholder(flag)
    return f"  {names} {kind}" if kind else f"  {names}"


def flags_block(flags: Sequence[Flag], columns: int) -> list[str]:
    """One entry per flag: names and placeholder, then the help wrapped beside or below."""
    names = [_flag_names(f) for f in flags]
    column = min(max((len(n) for n in names), default=0), _FLAG_COLUMN_MAX, columns // 2)
    lines: list[str] = []
    for flag, shown in zip(flags, names, strict=True):
        indent = " " * (column + 3)
        text = _flag_help(flag)
        if len(shown) <= column:
            lines.extend(_wrap(text, columns, indent, first=shown.ljust(column + 3)))
        else:
            lines.extend(
                _wrap(shown, columns, " " * 10, first=shown[: len(shown) - len(shown.lstrip())])
            )
            lines.extend(_wrap(text, columns, indent))
    return lines


def _aliases(command: Command) -> str | None:
    reverse = {v: k for k, v in ALIASES.items()}
    alias = reverse.get(command.path[0])
    return " ".join((alias, *command.path[1:])) if alias else None


def _examples(command: Command, columns: int) -> list[str]:
    """Comments wrap as comments; a command wraps with a trailing backslash, so a copied
    example still runs."""
    lines: list[str] = []
    for line in command.examples.strip("\n").splitlines():
        text = line.strip()
        if text.startswith("#"):
            lines.extend(_wrap(text[1:].strip(), columns, "  # "))
        elif text:
            parts = _wrap(text, columns - 2, "      ", first="  ")
            lines.extend(p + " \\" for p in parts[:-1])
            lines.append(parts[-1])
        else:
            lines.append("")
    return lines


def command_help(command: Command, env: Mapping[str, str] | None = None) -> str:
    """``gpustack-operator PATH --help``."""
    columns = width(env)
    name = " ".join(command.path)
    lines = [*_wrap(command.summary, columns), "", "Usage:"]
    lines.extend(_wrap(f"{NAME} {name} [flags]{command.usage}", columns, "    ", first="  "))
    alias = _aliases(command)
    if alias:
        lines += ["", "Aliases:", f"  {name}, {alias}"]
    subs = [c for c in COMMANDS if len(c.path) == 2 and c.path[0] == command.path[0]]
    if len(command.path) == 1 and subs:
        lines += ["", "Available Commands:", *_listing(subs, columns, last=True)]
    if command.examples:
        lines += ["", "Examples:", *_examples(command, columns)]
    lines += ["", "Flags:", *flags_block(command.flags, columns)]
    lines += ["", "Global Flags:", *flags_block(GLOBAL_FLAGS, columns)]
    return "\n".join(lines) + "\n"


def group_help(group: str, env: Mapping[str, str] | None = None) -> str:
    """``gpustack-operator device-manager --help``: a group that is no command itself."""
    columns = width(env)
    subs = [c for c in COMMANDS if c.path[0] == group]
    alias = next((a for a, full in ALIASES.items() if full == group), None)
    lines = [f"The {group} commands.", "", "Usage:", f"  {NAME} {group} COMMAND [flags]"]
    if alias:
        lines += ["", "Aliases:", f"  {group}, {alias}"]
    lines += ["", "Available Commands:", *_listing(subs, columns, last=True)]
    lines += ["", *_wrap(f"Use '{NAME} {group} COMMAND --help' for a command's flags.", columns)]
    return "\n".join(lines) + "\n"


def _listing(entries: Sequence[Command], columns: int, *, last: bool = False) -> list[str]:
    pairs = [(" ".join(c.path[1:] if last else c.path), c.summary) for c in entries]
    return _pairs(pairs, columns)


def _pairs(pairs: Sequence[tuple[str, str]], columns: int) -> list[str]:
    column = min(max(len(n) for n, _ in pairs), columns // 2)
    lines: list[str] = []
    for name, summary in pairs:
        indent = " " * (column + 5)
        if len(name) <= column:
            lines.extend(_wrap(summary, columns, indent, first=f"  {name.ljust(column)}   "))
        else:
            lines.extend(_wrap(name, columns, "    ", first="  "))
            lines.extend(_wrap(summary, columns, indent))
    return lines


def overview(env: Mapping[str, str] | None = None) -> str:
    """``gpustack-operator``, ``--help`` and ``help``: every command, with its alias."""
    columns = width(env)
    reverse = {v: k for k, v in ALIASES.items()}
    pairs: list[tuple[str, str]] = []
    for command in COMMANDS:
        shown = " ".join(command.path)
        alias = reverse.get(command.path[0])
        if alias:
            shown += f" ({' '.join((alias, *command.path[1:]))})"
        pairs.append((shown, command.summary))
    pairs.extend(BUILTINS)
    intro = (
        "Accelerators and cached models of a Kubernetes cluster, visible and allocatable: "
        "node agents, a control plane, and tools to look at both."
    )
    lines = [*_wrap(intro, columns), "", "Usage:", f"  {NAME} COMMAND [flags]", ""]
    lines += ["Available Commands:", *_pairs(pairs, columns), ""]
    lines += ["Global Flags:", *flags_block(GLOBAL_FLAGS, columns), ""]
    lines += _wrap(
        f"Use '{NAME} COMMAND --help' (or '{NAME} help COMMAND') for a command's flags "
        "and examples.",
        columns,
    )
    return "\n".join(lines) + "\n"

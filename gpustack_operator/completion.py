"""``gpustack-operator completion bash|zsh|fish``: shell completion scripts from the command table.

The scripts are generated from :mod:`gpustack_operator.commands`, so a command, alias or flag
added there completes without editing a script: commands and aliases, a group's subcommands,
each command's flags (its own and the global ones), and the values of a flag with fixed
choices (``-o``/``--output``, ``--kind``). They complete offline, from text fixed at generation
time, and never run the binary on a key press (cobra's scripts call the binary back; this one
starts in tens of milliseconds, but a static table is still instant and needs nothing on PATH).

Install as kubectl's: ``source <(gpustack-operator completion bash)``; zsh and fish likewise
(``gpustack-operator completion fish | source``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from typing import Final

from gpustack_operator.commands import ALIASES, COMMANDS, GLOBAL_FLAGS, Command
from gpustack_operator.flags import Flag

__all__ = ["SHELLS", "bash", "command", "fish", "script", "zsh"]

SHELLS: Final = ("bash", "zsh", "fish")
NAME: Final = "gpustack-operator"
_FUNCTION: Final = "_gpustack_operator"
_BUILTINS: Final = ("completion", "help")
EXIT_USAGE: Final = 2

USAGE: Final = f"""Print a shell completion script (bash, zsh or fish).

Usage:
  {NAME} completion bash|zsh|fish

Examples:
  # bash, this shell only
  source <({NAME} completion bash)

  # zsh, this shell only
  source <({NAME} completion zsh)

  # fish, this shell only
  {NAME} completion fish | source
"""


def command(words: Sequence[str], *, wants_help: bool) -> int:
    """The ``completion`` command: the script on stdout (exit 0), or usage (exit 2)."""
    if wants_help:
        sys.stdout.write(USAGE)
        return 0
    if len(words) != 1 or words[0] not in SHELLS:
        given = " ".join(words) or "no shell"
        sys.stderr.write(f"{NAME} completion: needs one of {', '.join(SHELLS)} (got {given})\n")
        return EXIT_USAGE
    sys.stdout.write(script(words[0]))
    return 0


def script(shell: str) -> str:
    """The completion script for ``shell``. :raises ValueError: not one of :data:`SHELLS`."""
    if shell == "bash":
        return bash()
    if shell == "zsh":
        return zsh()
    if shell == "fish":
        return fish()
    raise ValueError(f"no completion for {shell!r}; expected one of {', '.join(SHELLS)}")


def _names(flag: Flag) -> list[str]:
    long = f"-{flag.name}" if len(flag.name) == 1 else f"--{flag.name}"
    return [long, *([f"-{flag.short}"] if flag.short else [])]


def _all_flags(cmd: Command | None) -> tuple[Flag, ...]:
    return (*(cmd.flags if cmd else ()), *GLOBAL_FLAGS)


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for cmd in COMMANDS:
        if len(cmd.path) == 2:
            groups.setdefault(cmd.path[0], []).append(cmd.path[1])
    return groups


def _tops() -> list[str]:
    tops = list(dict.fromkeys(c.path[0] for c in COMMANDS))
    return [*tops, *ALIASES, *_BUILTINS]


def _words(items: Sequence[str]) -> str:
    return shlex.quote(" ".join(items))


def _case(pattern: str, cmd: Command | None, subs: Sequence[str]) -> str:
    """One ``case`` entry: a flag's choices after it, else subcommands and flags."""
    flags = _all_flags(cmd)
    inner = [
        f"      {' | '.join(_names(f))}) words={_words([c for c in f.choices if c])} ;;"
        for f in flags
        if f.choices
    ]
    names = [n for f in flags for n in _names(f)]
    inner.append(f"      *) [[ $expecting == 1 ]] || words={_words([*subs, *names])} ;;")
    body = "\n".join(inner)
    return f'    {pattern})\n      case "$prev" in\n{body}\n      esac\n      ;;'


def bash() -> str:
    """A bash script (also read by zsh through ``bashcompinit``)."""
    valued = sorted(
        {n for c in COMMANDS for f in _all_flags(c) if f.kind != "bool" for n in _names(f)}
    )
    groups = _groups()
    cases = [
        _case(
            shlex.quote(" ".join(c.path)), c, groups.get(c.path[0], []) if len(c.path) == 1 else ()
        )
        for c in COMMANDS
    ]
    # A word after a command that is no subcommand (a REPOSITORY) leaves its flags in force.
    cases += [
        _case(f'{shlex.quote(" ".join(c.path))}" "*', c, ())
        for c in sorted(COMMANDS, key=lambda c: -len(c.path))
    ]
    cases += [
        f"    {shlex.quote(g)}) words={_words(subs)} ;;"
        for g, subs in groups.items()
        if not any(c.path == (g,) for c in COMMANDS)
    ]
    aliases = "\n".join(f"      {a}) w={full} ;;" for a, full in ALIASES.items())
    return _BASH.format(
        fn=_FUNCTION,
        name=NAME,
        valued=_words(valued),
        aliases=aliases,
        root=_case('""', None, _tops()),
        help_words=_words(_tops()),
        shells=_words(SHELLS),
        cases="\n".join(cases),
    )


_BASH = """# bash completion for {name}; source it: source <({name} completion bash)
{fn}() {{
  local cur prev words="" path="" w i skip=0 expecting=0
  cur="${{COMP_WORDS[COMP_CWORD]}}"
  prev="${{COMP_WORDS[COMP_CWORD-1]}}"
  if [[ "$cur" == "=" ]]; then
    cur=""
  elif [[ "$prev" == "=" && $COMP_CWORD -ge 2 ]]; then
    prev="${{COMP_WORDS[COMP_CWORD-2]}}"
  fi
  if [[ "$cur" == "" && "${{COMP_WORDS[COMP_CWORD-1]}}" == "=" ]]; then
    prev="${{COMP_WORDS[COMP_CWORD-2]}}"
  fi
  local valued=" "{valued}" "
  [[ "$valued" == *" $prev "* ]] && expecting=1
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${{COMP_WORDS[i]}}"
    if [[ $skip == 1 ]]; then skip=0; continue; fi
    if [[ "$w" == "=" ]]; then skip=1; continue; fi
    if [[ "$w" == -* ]]; then
      [[ "${{COMP_WORDS[i+1]}}" != "=" && "$valued" == *" $w "* ]] && skip=1
      continue
    fi
    if [[ -z "$path" ]]; then
      case "$w" in
{aliases}
      esac
      path="$w"
    else
      path="$path $w"
    fi
  done
  case "$path" in
{root}
    help | "help "*) words={help_words} ;;
    completion) words={shells} ;;
{cases}
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F {fn} {name}
"""


def zsh() -> str:
    """zsh reads the bash script through its ``bashcompinit`` layer, as many CLIs ship."""
    return (
        f"#compdef {NAME}\n# zsh completion for {NAME}; source it: "
        f"source <({NAME} completion zsh)\n"
        "autoload -U +X compinit && compinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash()
    )


def fish() -> str:
    """fish's own ``complete`` lines: subcommands by condition, flags with their choices."""
    lines = [f"# fish completion for {NAME}; load it: {NAME} completion fish | source"]
    lines.append(f"complete -c {NAME} -f")
    reverse = {full: alias for alias, full in ALIASES.items()}
    first = f"complete -c {NAME} -n __fish_use_subcommand"
    for top in dict.fromkeys(c.path[0] for c in COMMANDS):
        summary = _fish_text(next(c.summary for c in COMMANDS if c.path[0] == top))
        lines.extend(f"{first} -a {w} -d {summary}" for w in (top, reverse.get(top)) if w)
    lines.extend(f"{first} -a {word}" for word in _BUILTINS)
    lines.append(
        f"complete -c {NAME} -n '__fish_seen_subcommand_from completion' -a '{' '.join(SHELLS)}'"
    )
    for group, subs in _groups().items():
        seen = " ".join(filter(None, (group, reverse.get(group))))
        unseen = f"not __fish_seen_subcommand_from {' '.join(subs)}"
        lines.extend(
            f"complete -c {NAME} -n '__fish_seen_subcommand_from {seen}; and {unseen}' -a {sub}"
            for sub in subs
        )
    for cmd in COMMANDS:
        seen = " ".join(filter(None, (cmd.path[0], reverse.get(cmd.path[0]))))
        condition = f"__fish_seen_subcommand_from {seen}"
        if len(cmd.path) == 2:
            condition += f"; and __fish_seen_subcommand_from {cmd.path[1]}"
        lines.extend(_fish_flag(f, condition) for f in cmd.flags)
    lines.extend(_fish_flag(f, "") for f in GLOBAL_FLAGS)
    return "\n".join(lines) + "\n"


def _fish_flag(flag: Flag, condition: str) -> str:
    parts = [f"complete -c {NAME}"]
    if condition:
        parts.append(f"-n '{condition}'")
    parts.append(f"-l {flag.name}" if len(flag.name) > 1 else f"-o {flag.name}")
    if flag.short:
        parts.append(f"-s {flag.short}")
    choices = [c for c in flag.choices if c]
    if choices:
        parts.append(f"-x -a '{' '.join(choices)}'")
    elif flag.kind != "bool":
        parts.append("-r")
    parts.append(f"-d {_fish_text(flag.help)}")
    return " ".join(parts)


def _fish_text(text: str) -> str:
    first = text.split(";")[0].split(". ")[0]
    return "'" + first.replace("\\", "\\\\").replace("'", "\\'") + "'"

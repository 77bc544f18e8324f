"""The ``gpustack-operator`` entry point: find the command, parse its flags, hand off.

Only the chosen command's module is imported (by its ``module:function`` target), after the
flags are parsed and logging is configured, so ``dm detect`` starts in a few tens of
milliseconds and never loads kubernetes_asyncio, nats, grpclib or prometheus_client.

Services run under :mod:`gpustack_operator.process`, which owns the loop, the signals and the
exit codes of a long-lived process. Exit codes: 0 success, 1 the command failed, 2 the command
line (or the configuration it makes) was wrong.
"""

from __future__ import annotations

import functools
import gc
import importlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, NoReturn, cast

from gpustack_operator import logs
from gpustack_operator.commands import ALIASES, COMMANDS, GLOBAL_FLAGS, Command
from gpustack_operator.flags import FlagError, Parsed, effective_cmdline, parse
from kit.options import Options, SettingsError
from kit.redaction import redact_urls

log = logging.getLogger(__name__)

EXIT_USAGE = 2


class NeedsSubcommand(LookupError):
    """The words name a group (``device-manager``) but none of its subcommands."""

    def __init__(self, group: str, subs: Sequence[str]) -> None:
        super().__init__(f"{group} needs one of: {', '.join(subs)}")
        self.group = group


def _nothing() -> None:
    pass


def main(argv: Sequence[str] | None = None, *, loaded: Callable[[], None] = _nothing) -> int:
    """Run the command ``argv`` names; returns the exit code. ``loaded`` is called once the
    command's modules are imported and its settings built, just before it runs.

    As kubectl: no command at all, ``--help``, ``-h`` and ``help`` print the overview on stdout
    and exit 0; ``help COMMAND`` and ``COMMAND --help`` print the command's help and exit 0; a
    group without its subcommand (``dm``) is a usage error whose message is the group's help.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    words = [a for a in args if not a.startswith("-")]
    if words and words[0] in ("help", "completion"):
        return _builtin(words[0], words[1:], wants_help=_wants_help(args))
    try:
        command, rest = find_command(args)
    except NeedsSubcommand as e:
        wanted = _wants_help(args)
        from gpustack_operator import helptext  # only a help path imports it

        print(helptext.group_help(e.group, os.environ), end="", file=None if wanted else sys.stderr)
        return 0 if wanted else EXIT_USAGE
    except LookupError as e:
        if _wants_version(args):
            print(f"gpustack-operator {_version()}")
            return 0
        if not words and (not args or _wants_help(args)):
            from gpustack_operator import helptext  # only a help path imports it

            print(helptext.overview(os.environ), end="")
            return 0
        print(f"gpustack-operator: {e}\n{_HINT}", file=sys.stderr)
        return EXIT_USAGE
    flags = (*command.flags, *GLOBAL_FLAGS)
    try:
        parsed = parse(rest, flags, os.environ)
    except FlagError as e:
        print(f"gpustack-operator {' '.join(command.path)}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if parsed.help:
        from gpustack_operator import helptext  # only a help path imports it

        print(helptext.command_help(command, os.environ), end="")
        return 0
    if parsed.values["version"]:
        print(f"gpustack-operator {_version()}")
        return 0
    return run(command, parsed, loaded)


_HINT = "Run 'gpustack-operator --help' for the commands."


def _wants_help(args: Sequence[str]) -> bool:
    return any(a in ("-h", "--help", "-help") for a in args)


def _builtin(name: str, words: Sequence[str], *, wants_help: bool) -> int:
    """``help [COMMAND [SUB]]`` and ``completion SHELL``: the launcher's own commands."""
    from gpustack_operator import helptext  # only a help path imports it

    if name == "completion":
        from gpustack_operator import completion

        return completion.command(words, wants_help=wants_help)
    if not words:
        print(helptext.overview(os.environ), end="")
        return 0
    if words[0] in ("help", "completion"):
        return _builtin(words[0], words[1:], wants_help=True)
    try:
        command, rest = find_command(list(words))
    except NeedsSubcommand as e:
        if len(words) == 1:
            print(helptext.group_help(e.group, os.environ), end="")
            return 0
        command, rest = None, list(words)
    except LookupError:
        command, rest = None, list(words)
    if command is None or rest:
        topic = " ".join(words)
        print(f"gpustack-operator help: unknown help topic {topic!r}\n{_HINT}", file=sys.stderr)
        return EXIT_USAGE
    print(helptext.command_help(command, os.environ), end="")
    return 0


def console() -> NoReturn:
    """The console script: :func:`main` with the collector paced for a fresh process.

    Start-up: importing a command's modules allocates tens of thousands of objects that live as
    long as the process and are never garbage, yet trigger dozens of collections (about 4 ms
    of a small ``mm pull``'s start). The collector is off until the command is loaded
    (:func:`_loaded`), which then freezes everything alive into the permanent generation, so
    later collections scan only what the command itself makes.

    Exit: the interpreter's last collection would scan every object still alive, the whole
    module graph included (40-70 ms of a small ``mm pull`` here, on a process that is ending);
    ``gc.freeze`` first leaves it nothing to scan. Finalizers, ``atexit`` handlers and flushing
    still run as usual. Only here, not in :func:`main`, which tests call in-process.
    """
    gc.disable()
    code = main(loaded=_loaded)
    gc.freeze()
    sys.exit(code)


def _loaded() -> None:
    gc.freeze()
    gc.enable()


def run(command: Command, parsed: Parsed, loaded: Callable[[], None] = _nothing) -> int:
    name = " ".join(command.path)
    try:
        logs.configure(log_settings(parsed.values))
    except ValueError as e:
        print(f"gpustack-operator {name}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if parsed.values["print_cmdline"]:
        _tell(logging.INFO, effective_cmdline(command.path, parsed))
    if parsed.positionals and not command.usage:
        unexpected = " ".join(parsed.positionals)
        _tell(logging.ERROR, f"gpustack-operator {name}: unexpected arguments: {unexpected}")
        return EXIT_USAGE
    options = Options(parsed.values, positionals=parsed.positionals, env=os.environ)
    try:
        settings = _load(command.settings)(options)
    except SettingsError as e:
        _tell(logging.ERROR, f"gpustack-operator {name}: {e}")
        return EXIT_USAGE
    if command.service is not None:
        service = _load(command.service)
        loaded()
        return _serve(name, service, settings)
    assert command.oneshot is not None
    oneshot = _load(command.oneshot)
    loaded()
    return _once(oneshot, settings)


def _tell(level: int, text: str) -> None:
    """A line for the person at the terminal, on stderr: as written in the text format; as a
    log entry in the JSON format, where a collector must be able to parse every line. Either
    way a password inside a URL is redacted (a settings error may quote the URL it refuses)."""
    if logs.json_lines():
        log.log(level, "%s", text)
    else:
        print(redact_urls(text), file=sys.stderr)


def _serve(name: str, service: Callable[[Any], Awaitable[object]], settings: object) -> int:
    from gpustack_operator import process  # loads the service stacks' error types

    return process.run_service(process.Service(name, functools.partial(service, settings)))


def _once(oneshot: Callable[[Any], int], settings: object) -> int:
    try:
        return oneshot(settings)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (``| head``); that is not our failure.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _load(target: str) -> Callable[..., Any]:
    module_name, _, function = target.partition(":")
    return cast(Callable[..., Any], getattr(importlib.import_module(module_name), function))


def options_for(
    path: Sequence[str], argv: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Options:
    """The options the launcher would hand ``path``'s settings builder (tests, benchmarks).

    :raises FlagError: as the command line would be refused.
    """
    command = next(c for c in COMMANDS if c.path == tuple(path))
    environment = {} if env is None else env
    parsed = parse(argv, (*command.flags, *GLOBAL_FLAGS), environment)
    return Options(parsed.values, positionals=parsed.positionals, env=environment)


def _version() -> str:
    """The installed distribution's version: the one every agent reports (kit.version)."""
    from kit.version import package_version  # only --version pays for importlib.metadata

    return package_version()


def find_command(args: list[str]) -> tuple[Command, list[str]]:
    """Return the command named by the leading words of ``args`` and the remaining arguments.

    Flags may come before the command words (``-v=2 dm detect``); aliases are expanded.
    :raises LookupError: naming what was not understood.
    """
    words = [i for i, a in enumerate(args) if not a.startswith("-")]
    if not words:
        raise LookupError("no command given")
    first = words[0]
    head = ALIASES.get(args[first], args[first])
    candidates = [c for c in COMMANDS if c.path[0] == head]
    if not candidates:
        raise LookupError(f"unknown command {args[first]!r}")
    second = next((i for i in words if i > first), None)
    for command in candidates:
        if len(command.path) == 2 and second is not None and command.path[1] == args[second]:
            return command, args[:first] + args[first + 1 : second] + args[second + 1 :]
    for command in candidates:
        if len(command.path) == 1:  # ``model-manager`` itself, beside ``model-manager manifest``
            return command, args[:first] + args[first + 1 :]
    raise NeedsSubcommand(head, [c.path[1] for c in candidates])


def log_settings(values: dict[str, object]) -> logs.LogSettings:
    """:raises ValueError: for malformed ``--vmodule`` or ``--log_backtrace_at``."""
    return logs.LogSettings(
        verbosity=cast(int, values["v"]),
        vmodule=logs.parse_vmodule(cast(str, values["vmodule"])),
        to_stderr=cast(bool, values["logtostderr"]),
        add_dir_header=cast(bool, values["add_dir_header"]),
        skip_headers=cast(bool, values["skip_headers"]),
        backtrace_at=logs.parse_backtrace_at(cast(str, values["log_backtrace_at"])),
        logging_format=cast(Literal["text", "json"], values["logging_format"]),
    )


def _wants_version(args: list[str]) -> bool:
    return any(a.lstrip("-") in ("version", "version=true") for a in args)


if __name__ == "__main__":
    console()

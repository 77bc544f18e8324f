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
from gpustack_operator.flags import FlagError, Parsed, effective_cmdline, parse, render_help
from kit.options import Options, SettingsError
from kit.redaction import redact_urls

log = logging.getLogger(__name__)

EXIT_USAGE = 2


def _nothing() -> None:
    pass


def main(argv: Sequence[str] | None = None, *, loaded: Callable[[], None] = _nothing) -> int:
    """Run the command ``argv`` names; returns the exit code. ``loaded`` is called once the
    command's modules are imported and its settings built, just before it runs."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        command, rest = find_command(args)
    except LookupError as e:
        if _wants_version(args):
            print(f"gpustack-operator {_version()}")
            return 0
        print(f"gpustack-operator: {e}\n\n{overview()}", file=sys.stderr, end="")
        return EXIT_USAGE
    flags = (*command.flags, *GLOBAL_FLAGS)
    try:
        parsed = parse(rest, flags, os.environ)
    except FlagError as e:
        print(f"gpustack-operator {' '.join(command.path)}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if parsed.help:
        usage = f"gpustack-operator {' '.join(command.path)} [flags]{command.usage}"
        print(render_help(usage, command.summary, flags), end="")
        return 0
    if parsed.values["version"]:
        print(f"gpustack-operator {_version()}")
        return 0
    return run(command, parsed, loaded)


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
    subs = ", ".join(c.path[1] for c in candidates)
    raise LookupError(f"{head} needs one of: {subs}")


def overview() -> str:
    lines = ["Usage: gpustack-operator COMMAND [flags]", "", "Commands:"]
    reverse = {v: k for k, v in ALIASES.items()}
    for command in COMMANDS:
        alias = reverse.get(command.path[0])
        shown = " ".join(command.path)
        if alias:
            shown += f" ({' '.join((alias, *command.path[1:]))})"
        lines.append(f"  {shown:<40} {command.summary}")
    lines.append("\nRun 'gpustack-operator COMMAND --help' for a command's flags.")
    return "\n".join(lines) + "\n"


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

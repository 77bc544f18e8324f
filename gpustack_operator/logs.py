"""klog-shaped logging on standard error, configured once from the global flags.

Line shape: ``Lmmdd hh:mm:ss.uuuuuu THREADID file.py:LINE] message`` as klog writes it, so the
logs of this binary read like every other node component's. Verbosity follows klog: ``-v=0``
shows INFO and above, ``-v=1`` adds level 15, ``-v=2`` DEBUG, ``-v=3`` the per-decision lines
logged at :data:`V3`. ``--vmodule`` raises verbosity for matching source files and loggers.
``--logging-format=json`` writes one JSON object per line instead (:class:`JsonFormatter`).

``-v`` applies to our own packages only; other libraries' loggers stay at WARNING unless a
``--vmodule`` pattern names them (see :class:`_VerbosityFilter`).

Invariants: logs never go to standard output, which carries only the command's document; no
line shows a password inside a URL (every formatted line passes :func:`kit.redaction.redact_urls`,
behind the redaction at the points that log URLs, for lines from libraries that do not know).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Literal

from kit.redaction import redact_urls

V3 = 5
"""Level of the per-decision lines shown from ``-v=3``."""

_installed: list[logging.Handler] = []
"""Handlers :func:`configure` installed, so a reconfiguration closes only its own."""

_LEVEL_OF_V = {0: logging.INFO, 1: 15, 2: logging.DEBUG, 3: V3}
_LETTER = {logging.CRITICAL: "F", logging.ERROR: "E", logging.WARNING: "W"}


@dataclass(frozen=True)
class LogSettings:
    verbosity: int = 0
    vmodule: tuple[tuple[str, int], ...] = ()
    to_stderr: bool = True
    add_dir_header: bool = False
    skip_headers: bool = False
    backtrace_at: tuple[str, int] | None = None
    logging_format: Literal["text", "json"] = "text"


def level_for(verbosity: int) -> int:
    return _LEVEL_OF_V[min(max(verbosity, 0), 3)]


def parse_vmodule(text: str) -> tuple[tuple[str, int], ...]:
    """Parse ``pattern=N,pattern=N``. :raises ValueError: on a malformed entry."""
    entries = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        pattern, sep, level = item.partition("=")
        if not sep or not pattern or not level.strip().isdigit():
            raise ValueError(f"invalid --vmodule entry {item!r} (want pattern=N)")
        entries.append((pattern.removesuffix(".py"), int(level)))
    return tuple(entries)


def parse_backtrace_at(text: str) -> tuple[str, int] | None:
    """Parse ``file.py:N``. :raises ValueError: on a malformed value."""
    if not text:
        return None
    name, sep, line = text.rpartition(":")
    if not sep or not name or not line.isdigit():
        raise ValueError(f"invalid --log_backtrace_at {text!r} (want file.py:N)")
    return name, int(line)


OWN_PACKAGES = frozenset(
    {"gpustack_operator", "agent", "controlplane", "bus", "hub", "kit", "proto", "root"}
)
"""Top-level logger names that ``-v`` applies to (``root``: the root logger itself)."""

THIRD_PARTY_LEVEL = logging.WARNING
"""Where every other logger stays unless ``--vmodule`` names it."""


class _VerbosityFilter(logging.Filter):
    """Admits a record when its level reaches the threshold of its logger and source file.

    ``-v`` applies to our own packages only: at ``-v=2`` the h2/hpack header dumps were 96% of
    an agent's lines, and kubernetes_asyncio logs whole response bodies. Every other logger
    (hpack, h2, grpclib, aiohttp, kubernetes_asyncio, nats, asyncio, ...) is held at
    :data:`THIRD_PARTY_LEVEL`. A ``--vmodule`` pattern overrides both for what it names: a
    source file by its stem, as klog does (``nvidia*=3``), or a logger by its name or one of
    its dotted parents (``hpack*=2``, ``kubernetes_asyncio=2``). The first matching pattern wins.
    """

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self._default = level_for(settings.verbosity)
        self._modules = [(p, level_for(n)) for p, n in settings.vmodule]
        self._thresholds: dict[tuple[str, str], int] = {}
        """Per (logger, file): a handful of dict lookups per line instead of fnmatch calls."""

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.filename)
        threshold = self._thresholds.get(key)
        if threshold is None:
            threshold = self._thresholds[key] = self._threshold(*key)
        return record.levelno >= threshold

    def _threshold(self, name: str, filename: str) -> int:
        stem = os.path.splitext(filename)[0]
        parts = name.split(".")
        names = [".".join(parts[: i + 1]) for i in range(len(parts))]
        for pattern, level in self._modules:
            if any(fnmatch.fnmatchcase(n, pattern) for n in (stem, *names)):
                return level
        return self._default if parts[0] in OWN_PACKAGES else THIRD_PARTY_LEVEL


class KlogFormatter(logging.Formatter):
    """klog's text line: ``Lmmdd hh:mm:ss.uuuuuu THREADID file.py:LINE] message``."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self._settings = settings

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if _backtrace_wanted(self._settings, record):
            message += "\n" + _caller_stack()
        if self._settings.skip_headers:
            return redact_urls(message)
        letter = _LETTER.get(record.levelno, "I")
        if record.levelno >= logging.CRITICAL:
            letter = "F"
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        micros = int(record.created % 1 * 1_000_000)
        where = record.pathname if self._settings.add_dir_header else record.filename
        header = (
            f"{letter}{stamp}.{micros:06d} {threading.get_native_id():7d} {where}:{record.lineno}]"
        )
        return redact_urls(f"{header} {message}")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the fields of Kubernetes' ``--logging-format=json``.

    Log collectors parse it without a klog grammar: ``ts`` (seconds since the epoch, a float),
    ``caller`` (``file.py:LINE``), ``msg``, ``v`` (the verbosity the line is shown from; an
    error has none, as in Kubernetes), ``err`` (the exception's type and message) and
    ``stacktrace`` when the record carries an exception, ``logger``, then every structured
    field passed as ``extra=``. A newline inside a message stays inside its JSON string.
    """

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self._settings = settings

    def format(self, record: logging.LogRecord) -> str:
        where = record.pathname if self._settings.add_dir_header else record.filename
        entry: dict[str, object] = {
            "ts": record.created,
            "caller": f"{where}:{record.lineno}",
            "msg": record.getMessage(),
        }
        if record.levelno < logging.ERROR:
            entry["v"] = _verbosity_of(record.levelno)
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            entry["err"] = f"{type(error).__name__}: {error}"
            entry["stacktrace"] = self.formatException(record.exc_info)
        elif _backtrace_wanted(self._settings, record):
            entry["stacktrace"] = _caller_stack()
        entry["logger"] = record.name
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                entry.setdefault(key, value)
        return redact_urls(_dumps(entry))


def _dumps(entry: dict[str, object]) -> str:
    """The entry as one JSON line; an extra JSON cannot hold (tuple keys, a cycle) as its repr,
    rather than the line lost to a "Logging error" dump on stderr. :mod:`json` is imported at
    the first JSON line: a command logging text (most one-shots) never pays for it."""
    import json

    try:
        return json.dumps(entry, default=repr, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return _dumps(
            {k: v if isinstance(v, str | int | float) else repr(v) for k, v in entry.items()}
        )


_RECORD_FIELDS = frozenset(
    (*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime", "taskName")
)
"""Attributes every record has: what is left over was passed as ``extra=``."""


def _verbosity_of(levelno: int) -> int:
    """The ``-v`` from which a record of this level is shown (WARNING and INFO: 0)."""
    return next((v for v, level in sorted(_LEVEL_OF_V.items()) if levelno >= level), 4)


def _backtrace_wanted(settings: LogSettings, record: logging.LogRecord) -> bool:
    at = settings.backtrace_at
    return at is not None and record.filename == at[0] and record.lineno == at[1]


def configure(settings: LogSettings) -> None:
    """Install the one handler of the process (idempotent: replaces an earlier one)."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if old in _installed:
            _installed.remove(old)
            old.close()
    handler: logging.Handler
    if settings.to_stderr:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.FileHandler(log_file_path(), encoding="utf-8")
    _installed.append(handler)
    handler.addFilter(_VerbosityFilter(settings))
    json_lines = settings.logging_format == "json"
    handler.setFormatter(JsonFormatter(settings) if json_lines else KlogFormatter(settings))
    root.addHandler(handler)
    lowest = min([level_for(settings.verbosity), *(level_for(n) for _, n in settings.vmodule)])
    root.setLevel(lowest)


def json_lines() -> bool:
    """Whether log lines are JSON: then text for people on stderr goes through logging too,
    so that every line a collector reads parses."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def log_file_path() -> str:
    """klog's file name: ``<program>.<host>.<user>.log.<date>-<time>.<pid>`` in the temp dir."""
    import getpass  # only file logging needs these; keep start-up lean
    import socket
    import tempfile

    user = getpass.getuser() if hasattr(os, "getuid") else "user"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"gpustack-operator.{socket.gethostname()}.{user}.log.{stamp}.{os.getpid()}"
    return os.path.join(tempfile.gettempdir(), name)


def _caller_stack() -> str:
    """The current stack without the logging machinery's own frames."""
    import traceback  # rare path

    frames = traceback.extract_stack()
    kept = [f for f in frames if not f.filename.startswith((_LOGGING_DIR, __file__))]
    return "".join(traceback.format_list(kept))


_LOGGING_DIR = os.path.dirname(logging.__file__)

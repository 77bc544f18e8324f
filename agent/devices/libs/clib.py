"""What the seven ctypes adapters share: loading a vendor library, calling it, mapping its codes.

Each vendor library (DCMI, CNDev, ROCm SMI, IXML, MXSML, MTML, HGML) has its own adapter module
that binds only the C functions the agent calls; this module is their common plumbing:

- :func:`load` opens the first loadable candidate with ``RTLD_LOCAL``, so a library exporting
  NVML's symbol names (IXML, Hygon's DMI) can never shadow ``libnvidia-ml`` or another vendor;
- :class:`Binding` calls one C function by name and turns a non-zero status into one of the
  :class:`LibError` types, named for what the caller should do, from the vendor's :class:`Codes`;
- the library object is a ``ctypes.CDLL`` on real hardware, or a simulator offering the same
  function names and writing through the same ``byref`` arguments (``agent.devices.simulation``),
  so the adapters cannot tell the two apart.

Nothing is cached across passes: each pass initialises the library again, so a driver that loads
after the agent starts is found on the next pass (a failed init is not remembered forever).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.errors import AgentError

log = logging.getLogger(__name__)

FUNCTION_NOT_FOUND = -99998
"""Binding-local code for a symbol the loaded library does not export."""
LIBRARY_NOT_FOUND = -99999
"""Binding-local code for a library no candidate path could load."""


class LibError(AgentError):
    """A vendor-library call failed; ``call`` names the C function, ``code`` is its status."""

    def __init__(self, call: str, code: int, code_name: str, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.code_name = code_name
        self.detail = detail or code_name
        super().__init__(f"{call}: {self.detail} ({code_name})")


class LibUnsupported(LibError):
    """The card or driver does not offer this value; only its field is lost."""


class LibLost(LibError):
    """The card stopped answering (fell off the bus); ask it nothing more this pass."""


class LibUnavailable(LibError):
    """The library cannot be used here at all: not installed, or its driver is not loaded."""


class LibFailed(LibError):
    """Any other failure."""


@dataclass(frozen=True)
class Codes:
    """A vendor's status codes: their names and which ones mean what to the caller."""

    names: dict[int, str]
    unsupported: frozenset[int] = frozenset()
    lost: frozenset[int] = frozenset()
    unavailable: frozenset[int] = frozenset()
    by_name: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {n: c for c, n in self.names.items()})

    def name(self, code: int) -> str:
        if code == FUNCTION_NOT_FOUND:
            return "FUNCTION_NOT_FOUND"
        if code == LIBRARY_NOT_FOUND:
            return "LIBRARY_NOT_FOUND"
        return self.names.get(code, f"ERROR_{code}")

    def error(self, call: str, code: int, detail: str = "") -> LibError:
        """Choose the error type for a status (pure, so tests can pin each vendor's table)."""
        name = self.name(code)
        if code in self.unsupported or code == FUNCTION_NOT_FOUND:
            return LibUnsupported(call, code, name, detail)
        if code in self.lost:
            return LibLost(call, code, name, detail)
        if code in self.unavailable or code == LIBRARY_NOT_FOUND:
            return LibUnavailable(call, code, name, detail)
        return LibFailed(call, code, name, detail)


def load(label: str, candidates: Sequence[str], codes: Codes) -> Any:
    """Open the first candidate that loads, privately (``RTLD_LOCAL``).

    A bare soname is searched on the loader path (``LD_LIBRARY_PATH``, ``ld.so.cache``); an
    absolute path is tried as is. :raises LibUnavailable: naming every candidate tried.
    """
    errors = []
    for candidate in candidates:
        if os.path.isabs(candidate) and not os.path.exists(candidate):
            errors.append(f"{candidate}: absent")
            continue
        try:
            library = ctypes.CDLL(candidate, mode=os.RTLD_LOCAL)
        except OSError as e:
            errors.append(str(e))
            continue
        log.info("loaded %s from %s", label, candidate)
        return library
    raise LibUnavailable(
        f"load {label}", LIBRARY_NOT_FOUND, codes.name(LIBRARY_NOT_FOUND), "; ".join(errors)
    )


class Binding:
    """Calls into one vendor library; every failure is one of the :class:`LibError` types.

    ``errors_by_call`` counts failures per C function (unsupported values excepted), for the
    agent's metrics, as the NVML adapter does.
    """

    def __init__(self, library: Any, codes: Codes, returns: dict[str, Any] | None = None) -> None:
        self.library = library
        self.codes = codes
        self.errors_by_call: Counter[str] = Counter()
        self._returns = returns or {}
        """C functions whose return is a value, not a status: name → ctypes restype."""

    def function(self, name: str) -> Callable[..., Any]:
        """The C function ``name``; :raises LibUnsupported: the library does not export it."""
        try:
            fn: Callable[..., Any] = getattr(self.library, name)
        except AttributeError:
            self.errors_by_call[name] += 1
            raise self.codes.error(
                name, FUNCTION_NOT_FOUND, "not exported by the library"
            ) from None
        restype = self._returns.get(name)
        if restype is not None and hasattr(fn, "restype"):
            fn.restype = restype
        return fn

    def call(self, name: str, *args: Any) -> None:
        """Call a status-returning function; a non-zero status raises."""
        status = int(self.function(name)(*args))
        if status != 0:
            error = self.codes.error(name, status)
            if not isinstance(error, LibUnsupported):
                self.errors_by_call[name] += 1
            raise error

    def value(self, name: str, *args: Any) -> Any:
        """Call a function that returns its result (``mxSmlGetDeviceCount``, a ``char*``)."""
        return self.function(name)(*args)


def text(value: Any) -> str:
    """A C string (a ``char`` array, ``bytes`` or ``None``) as text, NULs and blanks trimmed."""
    raw = getattr(value, "value", value)
    if raw is None:
        return ""
    if isinstance(raw, bytes):
        raw = raw.split(b"\x00", 1)[0].decode("utf-8", errors="replace")
    return str(raw).strip()


def brief_version(version: str | None) -> str | None:
    """``major.minor`` of a dotted version (``24.04.3`` → ``24.04``); None when it has no minor."""
    if not version:
        return None
    parts = version.strip().split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    minor = "".join(ch for ch in parts[1] if ch.isdigit())
    return f"{parts[0]}.{minor}" if minor else None


def cuda_style_version(value: int) -> str:
    """``major*1000 + minor*10 + patch`` as ``major.minor``: ``12030`` → ``12.3``."""
    return f"{value // 1000}.{value % 1000 // 10}"

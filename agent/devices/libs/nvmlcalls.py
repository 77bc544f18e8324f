"""How the NVML adapter calls the binding: NVML's return codes, this layer's error types, and
:class:`Binding`, which calls one binding function and maps its failure to one of those types.

The adapter's two modules build on it: :mod:`agent.devices.libs.nvml` (the :class:`~agent.devices.libs.nvml.Nvml`
class, and the names every caller imports) and :mod:`agent.devices.libs.nvmlmig` (MIG profiles and
instances). Callers import from :mod:`agent.devices.libs.nvml`, which re-exports what they need from
here. Nothing here imports ``pynvml``: a :class:`Binding` is given the library (the real module
or a pynvml-compatible simulator), and relies only on ``library.NVMLError`` and its int
``.value``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from agent.errors import AgentError

Handle = Any
"""An opaque NVML device handle (a ctypes pointer for the real library)."""

# NVML return codes (nvml.h); the simulator uses the same numbers.
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999

CODE_NAMES: dict[int, str] = {
    UNINITIALIZED: "UNINITIALIZED",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NOT_SUPPORTED: "NOT_SUPPORTED",
    NO_PERMISSION: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    NOT_FOUND: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    DRIVER_NOT_LOADED: "DRIVER_NOT_LOADED",
    TIMEOUT: "TIMEOUT",
    11: "IRQ_ISSUE",
    LIBRARY_NOT_FOUND: "LIBRARY_NOT_FOUND",
    FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    GPU_IS_LOST: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    IN_USE: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    INSUFFICIENT_RESOURCES: "INSUFFICIENT_RESOURCES",
    UNKNOWN: "UNKNOWN",
}

_UNSUPPORTED_CODES = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND})
_UNAVAILABLE_CODES = frozenset({LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED})
PROFILE_ABSENT_CODES = frozenset({NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND})
"""What a GI-profile scan gets for a profile index this card does not have: skip it, silently."""

ABSENT: Final[Any] = object()
"""What :meth:`Binding._call_unless` returns for an expected "nothing here" code."""


class NvmlError(AgentError):
    """An NVML call failed; ``call`` names it, ``code`` is NVML's return code."""

    def __init__(self, call: str, code: int, detail: str) -> None:
        self.call = call
        self.code = code
        self.code_name = CODE_NAMES.get(code, f"ERROR_{code}")
        self.detail = detail
        super().__init__(f"{call}: {detail} ({self.code_name})")


class NvmlUnsupported(NvmlError):
    """This value is not available from this card or driver; only its field is lost."""


class NvmlGpuLost(NvmlError):
    """The card no longer answers (fell off the bus); it must not be asked again this pass."""


class NvmlUnavailable(NvmlError):
    """NVML cannot be used at all here: the library is absent or the driver is not loaded."""


class NvmlCallFailed(NvmlError):
    """Any other NVML failure."""


class NvmlNotPermitted(NvmlUnsupported):
    """The caller lacks the privilege (MIG management needs root); detection drops the field."""


class NvmlNoRoom(NvmlCallFailed):
    """``INSUFFICIENT_RESOURCES``: the placement overlaps an instance, or the card is full."""


class NvmlInUse(NvmlCallFailed):
    """``IN_USE``: the instance is busy (a process, or compute instances inside); retry later."""


def map_error(call: str, code: int, detail: str) -> NvmlError:
    """Choose the error type for an NVML return code (pure, so tests can pin the table)."""
    if code == NO_PERMISSION:
        return NvmlNotPermitted(call, code, detail)
    if code in _UNSUPPORTED_CODES:
        return NvmlUnsupported(call, code, detail)
    if code == INSUFFICIENT_RESOURCES:
        return NvmlNoRoom(call, code, detail)
    if code == IN_USE:
        return NvmlInUse(call, code, detail)
    if code == GPU_IS_LOST:
        return NvmlGpuLost(call, code, detail)
    if code in _UNAVAILABLE_CODES:
        return NvmlUnavailable(call, code, detail)
    return NvmlCallFailed(call, code, detail)


def text(value: object) -> str:
    """A string NVML returned (bytes, NUL-padded, or already text), decoded and stripped."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace").rstrip("\x00").strip()
    return str(value).strip()


class Binding:
    """Calls into an NVML binding (``library``); every failure becomes an :class:`NvmlError`.

    ``errors_by_call`` counts the errors raised per NVML function name, for the agent's metrics;
    ``NOT_SUPPORTED`` ("this card has no such value") and an expected absence are not errors.
    """

    def __init__(self, library: Any) -> None:
        self.library: Any = library
        self.errors_by_call: Counter[str] = Counter()

    def _function(self, name: str) -> Callable[..., Any]:
        """``library.<name>``; a symbol the binding lacks is "unsupported" (and counted)."""
        fn: Callable[..., Any] | None = getattr(self.library, name, None)
        if fn is None:
            self.errors_by_call[name] += 1
            raise NvmlUnsupported(name, FUNCTION_NOT_FOUND, "not found in the NVML binding")
        return fn

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``library.<name>`` and map its failure to an :class:`NvmlError`."""
        fn = self._function(name)
        try:
            return fn(*args, **kwargs)
        except self.library.NVMLError as e:
            if int(e.value) != NOT_SUPPORTED:  # "this card has no such value": not an error
                self.errors_by_call[name] += 1
            raise map_error(name, int(e.value), str(e)) from e

    def _call_unless(self, absent: frozenset[int], name: str, *args: Any) -> Any:
        """Like :meth:`_call`, but a code in ``absent`` returns :data:`ABSENT`, uncounted."""
        fn = self._function(name)
        try:
            return fn(*args)
        except self.library.NVMLError as e:
            if int(e.value) in absent:
                return ABSENT
            self.errors_by_call[name] += 1
            raise map_error(name, int(e.value), str(e)) from e

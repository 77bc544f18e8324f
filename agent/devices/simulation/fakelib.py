"""What the simulated vendor libraries share: init state, per-card faults, lost cards, writes.

A simulated library is an object whose attributes are the vendor's C function names, called by
the adapters exactly as a ``ctypes.CDLL`` would be: status codes returned as ints, results
written through ``ctypes.byref`` arguments, strings into ``create_string_buffer`` buffers. So
the adapter code under test is the code that runs on hardware.

Behaviours every simulator reproduces:

- a call before init returns the vendor's "uninitialized" code; an ``init_error`` fails init;
- a card's ``faults`` (C function name → vendor error name) make that call fail for that card;
- once a card returns the vendor's "lost" code it returns it for every later call, as a card off
  the bus does; :meth:`SimulatedLibrary.lose` makes a card fall off now;
- every call is logged as ``(function, card position or None)`` in :attr:`calls`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from agent.devices.libs import clib
from agent.devices.simulation import layouts
from agent.errors import ProfileError


def put(ref: Any, value: Any) -> None:
    """Write a scalar through a ``byref`` (or ``pointer``) argument."""
    target = ref._obj if hasattr(ref, "_obj") else ref.contents
    target.value = value


def target(ref: Any) -> Any:
    """The structure a ``byref`` (or ``pointer``) argument points at."""
    return ref._obj if hasattr(ref, "_obj") else ref.contents


_C_INTEGERS = frozenset("bBhHiIlLqQ")
"""``_type_`` codes of the ctypes integer types (``c_uint(3)``; not pointers, not ``c_void_p``)."""


def plain(arg: Any) -> Any:
    if isinstance(arg, ctypes._SimpleCData) and getattr(arg, "_type_", "") in _C_INTEGERS:
        return arg.value
    return arg


def handle_value(handle: Any) -> int:
    """The address an opaque handle carries: ``c_void_p``, a typed pointer (``POINTER(struct)``,
    as independent bindings declare handles) or a plain int; 0 for none."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    return getattr(handle, "value", handle) or 0


def put_handle(ref: Any, value: int) -> None:
    """Write an opaque handle through ``ref``, whatever pointer type the caller declared."""
    out = target(ref)
    if isinstance(out, ctypes.c_void_p):
        out.value = value
    else:
        ctypes.memmove(ctypes.addressof(out), ctypes.byref(ctypes.c_void_p(value)), 8)


def accepts_c_integers(cls: type) -> type:
    """Let each public C function of a simulator take ``c_uint(3)`` where it takes ``3``.

    A real library cannot tell the two apart (both arrive as a C integer), and independent
    bindings pass either: the conformance tests call the simulators through them.
    """
    for name, function in list(vars(cls).items()):
        if name.startswith("_") or not callable(function) or name == "lose":
            continue

        def wrapper(self: Any, *args: Any, __function: Any = function) -> Any:
            return __function(self, *(plain(a) for a in args))

        wrapper.__name__ = name
        wrapper.__doc__ = function.__doc__
        setattr(cls, name, wrapper)
    return cls


class UndersizedBuffer(AssertionError):
    """An adapter passed a structure smaller than the library writes: on hardware, a heap
    overflow. Raised (never caught by the adapters) so the ordinary test run fails on it."""


def written(ref: Any, layout: str) -> Any:
    """The structure behind ``ref``, after writing all of ``layout``'s documented size into it.

    A real library writes its whole structure, reserved tail included, whatever the caller's
    idea of it; so does this (zeros, before the caller's fields are set). A buffer smaller than
    the documented size is refused with :class:`UndersizedBuffer` instead of overrun.
    """
    out = target(ref)
    size = layouts.SIZES[layout].size
    if ctypes.sizeof(out) < size:
        raise UndersizedBuffer(
            f"{layout}: the adapter passed {ctypes.sizeof(out)} bytes, the library writes {size}"
        )
    ctypes.memset(ctypes.addressof(out), 0, size)
    return out


def put_text(buffer: Any, text: str, size: int | None = None) -> int:
    """Copy ``text`` into a ``char`` buffer as C would (truncated to fit, NUL-terminated).

    Returns 0, or -1 when the buffer is too small (the caller maps it to its vendor's code).
    """
    raw = text.encode()
    room = size if size is not None else len(buffer)
    if len(raw) + 1 > room:
        return -1
    ctypes.memmove(buffer, raw + b"\x00", len(raw) + 1)
    return 0


class SimulatedLibrary:
    """Base of the simulators: :meth:`_card` and :meth:`_system` gate each call.

    Subclasses set ``CODES`` (the adapter's table), ``LOST`` and ``UNINITIALIZED`` (code names).
    """

    CODES: clib.Codes
    LOST: str
    UNINITIALIZED: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        accepts_c_integers(cls)

    def __init__(self, init_error: str | None, faults: Sequence[dict[str, str]]) -> None:
        self.init_error = self._code(init_error, "init_error") if init_error else None
        self.faults = [{fn: self._code(name, fn) for fn, name in f.items()} for f in faults]
        self.initialized = False
        self.lost: set[int] = set()
        self.calls: list[tuple[str, int | None]] = []

    def _code(self, name: str, where: str) -> int:
        code = self.CODES.by_name.get(name)
        if code is None:
            known = ", ".join(sorted(self.CODES.by_name))
            raise ProfileError(f"{where}: unknown error {name!r} (one of: {known})")
        return code

    def lose(self, position: int) -> None:
        """The card at ``position`` falls off the bus: every later call for it fails."""
        self.lost.add(position)

    def _init(self, name: str) -> int:
        self.calls.append((name, None))
        if self.init_error is not None:
            return self.init_error
        self.initialized = True
        return 0

    def _system(self, name: str) -> int:
        self.calls.append((name, None))
        return 0 if self.initialized else self.CODES.by_name[self.UNINITIALIZED]

    def _card(self, name: str, position: int) -> int:
        """0 when the call may proceed for this card, else the status it returns."""
        self.calls.append((name, position))
        if not self.initialized:
            return self.CODES.by_name[self.UNINITIALIZED]
        lost = self.CODES.by_name[self.LOST]
        if position in self.lost:
            return lost
        code = self.faults[position].get(name, 0) if position < len(self.faults) else 0
        if code == lost:
            self.lost.add(position)
        return code

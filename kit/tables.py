"""kubectl-style tables and human units for ``-o wide``: pure text, no I/O.

A table is upper-case headers and left-aligned columns three spaces apart, as ``kubectl get``
prints; a missing value is ``<none>``. Sizes are binary units (``80.0 GiB``), as
``kubectl top`` and the GPU tools print memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

__all__ = ["NONE", "cell", "human_bytes", "human_mib", "row", "table"]

NONE: Final = "<none>"
"""What kubectl prints for a value that is not there."""
_GAP: Final = "   "
_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: int | None) -> str:
    """``n`` bytes in the largest binary unit under 1024 of it: ``1.5 GiB``, ``512 B``."""
    if n is None:
        return NONE
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_mib(n: int | None) -> str:
    """``n`` MiB (the unit the vendor libraries report memory in) in human units."""
    return NONE if n is None else human_bytes(n << 20)


def cell(value: object) -> str:
    """A value as a cell: ``<none>`` for None or empty, tabs and newlines flattened."""
    if value is None or value == "":
        return NONE
    return " ".join(str(value).split())


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """The whole table, widths fitted to its content, ending in a newline."""
    cells = [[cell(v) for v in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
    return "".join(row(r, widths) for r in [[h.upper() for h in headers], *cells])


def row(cells: Sequence[object], widths: Sequence[int]) -> str:
    """One line of fixed ``widths`` (a streamed table cannot know its widths ahead; a longer
    cell pushes the rest of its line right, as ``kubectl get -w`` does)."""
    texts = [cell(c) for c in cells]
    padded = [t.ljust(w) for t, w in zip(texts[:-1], widths, strict=False)]
    return _GAP.join([*padded, texts[-1]]).rstrip() + "\n"

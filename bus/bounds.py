"""Semantic bounds of the wire shapes: the ranges no real accelerator, cache or agent exceeds.

The schema says a field is an ``int``; these say *which* ints. A node that sends a value valid
by type but absurd (``memory: -143771``, ``10**30``, a 1 MB name) would otherwise reach every
reader that folds nodes together, so the bounds live in the types themselves (``Annotated``
with :class:`msgspec.Meta`): the one strict decode of :mod:`bus.codec` checks them in the same
pass, a violation is a ``msgspec.ValidationError`` and the event is dropped and counted as
``malformed`` like any other bad shape, and ``bus schema`` publishes them as JSON Schema
``minimum``/``maximum``/``maxLength``/``maxItems``. Encoding does not check them (msgspec never
validates on encode); an honest agent stays well inside every one.

Each limit is far beyond what hardware shipping today reports (docs/bus.md lists them with the
reason), so a sane reading is never dropped; the aim is to refuse impossibility, not to judge
plausibility. Cross-node folds still must not trust one node's in-bound value over another's
(:mod:`controlplane.admission.cards`, :mod:`controlplane.chain.views`).
"""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import Meta

__all__ = [
    "ALLOCATION_DEVICES",
    "Bytes",
    "Celsius",
    "Counter",
    "Index",
    "Kib",
    "Mhz",
    "Mib",
    "Name",
    "Percent",
    "Ratio",
    "Seconds",
    "Small",
    "Text",
    "Units",
    "Watts",
]

MAX_MIB: Final = 16 * 1024 * 1024
"""16 TiB on one card (the largest cards of 2025 hold 288 GB, about 0.27 TiB)."""
MAX_SMALL: Final = 4096
"""Slices, profiles, instances, links or cores of one card; a card's accelerators index."""
MAX_COUNTER: Final = 2**63 - 1
"""A monotonic counter (energy in mJ, NVLink KiB): what an int64 reader holds."""

Mib = Annotated[int, Meta(ge=0, le=MAX_MIB, description="MiB, 0 to 16 TiB")]
Percent = Annotated[int, Meta(ge=0, le=100, description="percent, 0-100")]
Ratio = Annotated[float, Meta(ge=0.0, le=1.0, description="a ratio, 0-1")]
Celsius = Annotated[int, Meta(ge=-273, le=500, description="degrees Celsius, -273 to 500")]
Watts = Annotated[int, Meta(ge=0, le=100_000, description="watts, 0 to 100 kW")]
Mhz = Annotated[int, Meta(ge=0, le=100_000, description="MHz, 0 to 100 GHz")]
Kib = Annotated[int, Meta(ge=0, le=2**40, description="KB/s, 0 to 1 PB/s")]
Counter = Annotated[int, Meta(ge=0, le=MAX_COUNTER, description="a counter, 0 to 2^63-1")]
Bytes = Annotated[int, Meta(ge=0, le=2**60, description="bytes, 0 to 1 EiB")]
Small = Annotated[int, Meta(ge=0, le=MAX_SMALL, description="a count, 0-4096")]
Index = Annotated[int, Meta(ge=0, le=2**20, description="an index or device minor, 0 to 2^20")]
Units = Annotated[int, Meta(ge=0, le=1_600_000, description="ledger units, 0 to one card")]
Seconds = Annotated[float, Meta(gt=0.0, le=86_400.0, description="seconds, over 0, up to a day")]
Name = Annotated[str, Meta(max_length=256, description="a name or id, at most 256 characters")]
Text = Annotated[str, Meta(max_length=4096, description="a message, at most 4096 characters")]

ALLOCATION_DEVICES: Final = 65_536
"""Device ids one allocation lists (a partitioned or sliced grant lists tokens, not cards)."""

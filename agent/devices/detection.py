"""One detection or monitor pass over every manufacturer asked for.

The backends (:mod:`agent.devices.nvidia`, :mod:`agent.devices.amd`) each answer for one
manufacturer; this module runs them, keeps one manufacturer's failure from hiding another's
cards, applies the fast-failed retry, and puts the result in canonical order.

Everything here is synchronous: the one-shots call it directly, and the device agent runs a
whole pass in a worker thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from agent.errors import DetectionError, HostReadError
from bus import devices

log = logging.getLogger(__name__)

T = TypeVar("T")


class Backend(Protocol):
    """Detection and sampling for one manufacturer.

    ``detect`` and ``sample`` return empty lists when the manufacturer has no accelerator here,
    and raise :class:`DetectionError` when it has some that cannot be read.
    """

    manufacturer: str
    simulated: bool

    def detect(self) -> list[devices.DeviceGroup]: ...

    def sample(self) -> list[devices.AcceleratorSample]: ...


@dataclass
class PassResult(Generic[T]):
    """What one pass produced, and the manufacturers whose pass failed (with why)."""

    items: list[T] = field(default_factory=list)
    errors: list[DetectionError] = field(default_factory=list)


def detect(
    backends: Sequence[Backend],
    *,
    fast_failed: bool = True,
    retries: int = 2,
    retry_delay_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> PassResult[devices.DeviceGroup]:
    """Run a detect pass over ``backends`` and return the groups in canonical order.

    With ``fast_failed`` (the default) and exactly one manufacturer asked, a pass that finds
    nothing is held back and detection runs again up to ``retries`` times, because a driver that
    is still loading answers "nothing" once and the truth a moment later.
    """
    result = _detect_once(backends)
    attempts = 0
    while fast_failed and len(backends) == 1 and not result.items and attempts < retries:
        attempts += 1
        log.info(
            "no %s accelerator found; detecting again in %.1fs (%d/%d)",
            backends[0].manufacturer,
            retry_delay_s,
            attempts,
            retries,
        )
        sleep(retry_delay_s)
        result = _detect_once(backends)
    result.items = devices.canonical_groups(result.items)
    return result


def _detect_once(backends: Sequence[Backend]) -> PassResult[devices.DeviceGroup]:
    result: PassResult[devices.DeviceGroup] = PassResult()
    for backend in backends:
        try:
            result.items.extend(backend.detect())
        except DetectionError as e:
            result.errors.append(e)
        except HostReadError as e:  # sysfs that exists but cannot be read: this pass is lost
            result.errors.append(DetectionError(backend.manufacturer, str(e)))
    return result


def sample(
    backends: Sequence[Backend], *, now: datetime | None = None
) -> PassResult[devices.MonitorSample]:
    """Take one utilization sample per manufacturer that has accelerators here."""
    timestamp = rfc3339_nano(now)
    result: PassResult[devices.MonitorSample] = PassResult()
    for backend in backends:
        try:
            accelerators = backend.sample()
        except DetectionError as e:
            result.errors.append(e)
            continue
        except HostReadError as e:
            result.errors.append(DetectionError(backend.manufacturer, str(e)))
            continue
        if accelerators:
            result.items.append(
                devices.MonitorSample(
                    manufacturer=backend.manufacturer,
                    timestamp=timestamp,
                    simulated=backend.simulated,
                    accelerators=tuple(accelerators),
                )
            )
    return result


def rfc3339_nano(now: datetime | None = None) -> str:
    """Format a moment as RFC 3339 with nanoseconds and the local offset (Go's RFC3339Nano).

    Trailing zeros of the fraction are dropped as Go does; ``now`` defaults to the current time.
    """
    if now is None:
        ns = time.time_ns()
        now = datetime.fromtimestamp(ns // 1_000_000_000).astimezone()
        fraction = ns % 1_000_000_000
    else:
        fraction = now.microsecond * 1000
        now = now.astimezone()
    text = now.replace(microsecond=0).isoformat()
    stamp, offset = text[:19], text[19:]
    if offset in ("+00:00", "-00:00"):
        offset = "Z"
    digits = f"{fraction:09d}".rstrip("0")
    return f"{stamp}.{digits}{offset}" if digits else f"{stamp}{offset}"

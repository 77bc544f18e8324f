"""``dm detect`` and ``dm monitor``: one pass, printed as YAML, JSON or a table, for a person.

Both are pure reads. Standard output carries only the document, so ``| yq`` and ``| jq`` work;
every diagnostic goes to standard error. The document is printed even when one manufacturer
failed (the others' cards are still true), and the exit code is then 1 with one stderr line per
failure; "nothing found" is an empty list and exit 0. ``-o wide`` is a kubectl-style table,
one accelerator per row, memory in human units; ``-o name`` one ``accelerator/<id>`` per line
(either says ``No resources found.`` on stderr when empty, as kubectl does).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from agent.devices import detection, gpm, sources
from agent.devices.settings import DetectSettings
from agent.errors import ProfileError
from bus.devices import DeviceGroup, MonitorSample
from kit import rendering
from kit.tables import human_mib, table

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_USAGE = 2
LIST_PROFILES = "list"
"""``--simulate list`` prints the packaged profile names, one per line, and detects nothing."""


def detect_command(settings: DetectSettings) -> int:
    """Print ``Devices.spec.groups`` for this node."""
    return _one_pass(settings, _detect)


def monitor_command(settings: DetectSettings) -> int:
    """Print one utilization sample per manufacturer found."""
    return _one_pass(settings, _monitor)


Indexes = dict[str, int]
"""Accelerator id → its index on the node (a sample carries only the id)."""


def _detect(settings: DetectSettings) -> tuple[detection.PassResult[Any], Indexes]:
    with sources.open_backends(settings) as backends:
        result = detection.detect(
            backends,
            fast_failed=settings.fast_failed,
            retries=settings.retries,
            retry_delay_s=settings.retry_delay_s,
        )
    return result, {}


def _monitor(settings: DetectSettings) -> tuple[detection.PassResult[Any], Indexes]:
    """The sample; for ``-o wide`` also a detect pass of the same backends, for the INDEX
    column ``dm detect -o wide`` shows (a sample names its cards by id only)."""
    with sources.open_backends(settings) as backends:
        indexes: Indexes = {}
        if settings.output == "wide":
            groups = detection.detect(backends, fast_failed=False).items
            indexes = {a.id: a.index for g in groups for a in g.accelerators}
        primed = False
        for backend in backends:
            prime: Callable[[], bool] | None = getattr(backend, "prime", None)
            primed = bool(prime and prime()) or primed
        if primed:  # rates (NVIDIA GPM activity) need a first sample and a pause
            time.sleep(gpm.MIN_INTERVAL_S * 1.5)
        return detection.sample(backends), indexes


def _one_pass(
    settings: DetectSettings,
    run_pass: Callable[[DetectSettings], tuple[detection.PassResult[Any], Indexes]],
) -> int:
    if settings.simulate == LIST_PROFILES:
        from agent.devices.simulation import profiles

        sys.stdout.write("".join(f"{name}\n" for name in profiles.packaged_names()))
        return 0
    try:
        result, indexes = run_pass(settings)
    except ProfileError as e:
        print(f"--simulate: {e}", file=sys.stderr)
        return EXIT_USAGE
    output = settings.output
    if output == "yaml" or output == "json":
        sys.stdout.write(rendering.render(result.items, output))
    elif not result.items:
        print("No resources found.", file=sys.stderr)
    else:
        sys.stdout.write(names(result.items) if output == "name" else wide(result.items, indexes))
    sys.stdout.flush()
    for error in result.errors:
        log.error("%s", error)
    return EXIT_FAILED if result.errors else 0


_DETECT_COLUMNS = (
    "index",
    "id",
    "manufacturer",
    "product",
    "memory",
    "health",
    "sliced",
    "partitions",
)
_MONITOR_COLUMNS = (
    "index",
    "id",
    "manufacturer",
    "memory",
    "used",
    "util",
    "mem-util",
    "temp",
    "power",
)


def wide(items: list[DeviceGroup] | list[MonitorSample], indexes: Indexes | None = None) -> str:
    """Detect groups or monitor samples as a table, one accelerator per row (pure); a
    sample's INDEX comes from ``indexes`` (``<none>`` for a card it does not name)."""
    if all(isinstance(i, DeviceGroup) for i in items):
        groups = [i for i in items if isinstance(i, DeviceGroup)]
        return table(_DETECT_COLUMNS, [r for g in groups for r in _detect_rows(g)])
    samples = [i for i in items if isinstance(i, MonitorSample)]
    rows = [r for s in samples for r in _sample_rows(s, indexes or {})]
    return table((*_MONITOR_COLUMNS, "health"), rows)


def names(items: list[DeviceGroup] | list[MonitorSample]) -> str:
    """``-o name``: ``accelerator/<id>`` per accelerator, one per line, as ``kubectl get -o
    name`` prints ``kind/name`` (pure)."""
    return "".join(f"accelerator/{a.id}\n" for item in items for a in item.accelerators)


def _detect_rows(group: DeviceGroup) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for a in group.accelerators:
        logical, physical = a.status.logical_sliced, a.status.physical_sliced
        mig = ",".join(f"{p.name}x{p.count}" for p in physical.profiles) if physical else None
        health = "Unhealthy" if a.status.unhealthy else "Healthy"
        sliced = logical.count if logical else None
        row = (a.index, a.id, group.manufacturer, group.name, human_mib(group.memory), health)
        rows.append((*row, sliced, mig))
    return rows


def _pct(value: int | None) -> str | None:
    return None if value is None else f"{value}%"


def _sample_rows(sample: MonitorSample, indexes: Indexes) -> list[tuple[object, ...]]:
    return [
        (
            indexes.get(a.id),
            a.id,
            sample.manufacturer,
            human_mib(a.memory),
            human_mib(a.memory_usage),
            _pct(a.cores_utilization),
            _pct(a.memory_utilization),
            None if a.temperature is None else f"{a.temperature}C",
            None if a.power_usage is None else f"{a.power_usage}W",
            "Unhealthy" if a.unhealthy else "Healthy",
        )
        for a in sample.accelerators
    ]

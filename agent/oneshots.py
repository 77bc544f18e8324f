"""``dm detect`` and ``dm monitor``: one pass, printed as YAML or JSON, for a person on a node.

Both are pure reads. Standard output carries only the document, so ``| yq`` and ``| jq`` work;
every diagnostic goes to standard error. The document is printed even when one manufacturer
failed (the others' cards are still true), and the exit code is then 1 with one stderr line per
failure; "nothing found" is an empty list and exit 0.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from agent.devices import detection, sources
from agent.errors import ProfileError
from agent.settings import DetectSettings
from kit import rendering

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


def _detect(settings: DetectSettings) -> detection.PassResult[Any]:
    with sources.open_backends(settings) as backends:
        return detection.detect(
            backends,
            fast_failed=settings.fast_failed,
            retries=settings.retries,
            retry_delay_s=settings.retry_delay_s,
        )


def _monitor(settings: DetectSettings) -> detection.PassResult[Any]:
    with sources.open_backends(settings) as backends:
        return detection.sample(backends)


def _one_pass(
    settings: DetectSettings, run_pass: Callable[[DetectSettings], detection.PassResult[Any]]
) -> int:
    if settings.simulate == LIST_PROFILES:
        from agent.devices.simulation import profiles

        sys.stdout.write("".join(f"{name}\n" for name in profiles.packaged_names()))
        return 0
    try:
        result = run_pass(settings)
    except ProfileError as e:
        print(f"--simulate: {e}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(rendering.render(result.items, settings.output))
    sys.stdout.flush()
    for error in result.errors:
        log.error("%s", error)
    return EXIT_FAILED if result.errors else 0

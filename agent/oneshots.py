"""``dm detect`` and ``dm monitor``: one pass, printed as YAML or JSON, for a person on a node.

Both are pure reads. Standard output carries only the document, so ``| yq`` and ``| jq`` work;
every diagnostic goes to standard error. The document is printed even when one manufacturer
failed (the others' cards are still true), and the exit code is then 1 with one stderr line per
failure; "nothing found" is an empty list and exit 0.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, cast

from agent.devices import detection, sources
from agent.devices.manufacturers import UnknownManufacturer, parse_manufacturers
from agent.errors import ProfileError
from agent.settings import DetectSettings
from kit import rendering

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_USAGE = 2


def settings_from(values: Mapping[str, object], env: Mapping[str, str]) -> DetectSettings:
    """Build the settings from parsed flags and the environment (the process edge).

    :raises UnknownManufacturer: for a bad ``--manufacturer``.
    """
    manufacturer = cast(str, values["manufacturer"])
    simulate = cast(str, values.get("simulate") or "") or None
    return DetectSettings(
        manufacturers=parse_manufacturers(manufacturer),
        explicit_manufacturers=bool(manufacturer.strip()),
        pci_check=not values["no_pci_check"],
        fast_failed=not values["no_fast_failed"],
        host_root=env.get("GPUSTACK_HOST_ROOT") or "/",
        simulate=simulate,
        output=cast(Any, values["output"]),
    )


def detect_command(values: dict[str, object], positionals: list[str]) -> int:
    """Print ``Devices.spec.groups`` for this node."""
    return _one_pass(values, positionals, _detect)


def monitor_command(values: dict[str, object], positionals: list[str]) -> int:
    """Print one utilization sample per manufacturer found."""
    return _one_pass(values, positionals, _monitor)


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
    values: dict[str, object],
    positionals: list[str],
    run_pass: Callable[[DetectSettings], detection.PassResult[Any]],
) -> int:
    if positionals:
        print(f"unexpected arguments: {' '.join(positionals)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = settings_from(values, os.environ)
    except UnknownManufacturer as e:
        print(f"--manufacturer: {e}", file=sys.stderr)
        return EXIT_USAGE
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

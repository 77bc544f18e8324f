"""NVIDIA's device channel: the ``NVIDIA_VISIBLE_DEVICES`` env var, or CDI annotations.

``--nvidia-device-injection-strategy`` (``GPUSTACK_NVIDIA_DEVICE_INJECTION_STRATEGY``):

- ``envvar`` (the default): ``NVIDIA_VISIBLE_DEVICES=<UUIDs>``, which works only where the
  container's runtime is NVIDIA's (the node's default runtime, or ``runtimeClassName: nvidia``);
  elsewhere the container starts without the driver ("libcuda.so.1: cannot open shared object").
- ``cdi-annotations``: instead of the env var, the response carries the annotation
  ``cdi.k8s.io/gpustack-nvidia: nvidia.com/gpu=<name>[,…]`` and the container engine injects the
  devices its CDI specs describe. A name no spec on the node defines would fail the container
  at start ("unresolvable CDI devices"), so Allocate refuses it instead (FailedPrecondition),
  saying to generate the specs (``nvidia-ctk cdi generate``).
- ``auto``: CDI where every granted card resolves, the env var wherever one would not.

Names are validated against the specs found in :data:`SPEC_DIRS` (``/etc/cdi`` and
``/var/run/cdi``), which this agent reads and never writes. A card resolves by its UUID, else by
its index (the two names ``nvidia-ctk`` gives a GPU). Partitioned grants keep the env var (their
MIG UUID is created at Allocate, after the specs were written).

:func:`read_catalog` is the blocking read (call it in a worker thread); :func:`channel` is the
pure decision.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import yaml

from agent.deviceplugin import errors
from agent.deviceplugin.injection import Injection
from kit.files import InputRefused, read_capped

__all__ = [
    "ANNOTATION",
    "KIND",
    "SPEC_DIRS",
    "STRATEGIES",
    "Catalog",
    "Strategy",
    "channel",
    "read_catalog",
]

log = logging.getLogger(__name__)

Strategy = Literal["envvar", "cdi-annotations", "auto"]
STRATEGIES: Final[tuple[Strategy, ...]] = ("envvar", "cdi-annotations", "auto")
ANNOTATION: Final = "cdi.k8s.io/gpustack-nvidia"
KIND: Final = "nvidia.com/gpu"
SPEC_DIRS: Final = ("/etc/cdi", "/var/run/cdi")
ENV: Final = "NVIDIA_VISIBLE_DEVICES"
MAX_SPEC_BYTES: Final = 4 << 20
"""A spec larger than this is not read (nvidia-ctk's are a few hundred KiB on 8 GPUs)."""


@dataclass(frozen=True)
class Catalog:
    """The fully qualified device names (``<kind>=<name>``) the node's CDI specs define."""

    names: frozenset[str] = frozenset()


def read_catalog(dirs: Iterable[str] = SPEC_DIRS) -> Catalog:
    """Every device name the ``*.json`` / ``*.yaml`` specs in ``dirs`` define (blocking).

    A missing directory is no spec; an unreadable or malformed file is logged and skipped.
    """
    names: set[str] = set()
    for directory in dirs:
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.endswith((".json", ".yaml", ".yml")):
                names.update(_spec_names(os.path.join(directory, entry)))
    return Catalog(frozenset(names))


def _spec_names(path: str) -> set[str]:
    try:  # a regular file within the cap: never a FIFO or a device named *.json
        data = read_capped(path, limit=MAX_SPEC_BYTES)
    except InputRefused as e:
        log.warning("CDI spec not read (skipped): %s", e)
        return set()
    try:
        text = data.decode("utf-8")
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        log.warning("CDI spec %s is unreadable (skipped): %s", path, e)
        return set()
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        return set()
    devices = doc.get("devices")
    return {
        f"{doc['kind']}={d['name']}"
        for d in (devices if isinstance(devices, list) else [])
        if isinstance(d, dict) and isinstance(d.get("name"), str | int)
    }


def _resolved(catalog: Catalog, cards: Sequence[tuple[str, int]]) -> list[str] | None:
    """The CDI name of each ``(uuid, index)`` card; None when one has none."""
    found = []
    for uuid, index in cards:
        name = next((n for n in (f"{KIND}={uuid}", f"{KIND}={index}") if n in catalog.names), None)
        if name is None:
            return None
        found.append(name)
    return found


def channel(
    strategy: Strategy, injection: Injection, catalog: Catalog, cards: Sequence[tuple[str, int]]
) -> Injection:
    """``injection`` with its NVIDIA device channel chosen by ``strategy``.

    :raises errors.CannotInject: ``cdi-annotations``, and a card no CDI spec names.
    """
    if strategy == "envvar" or ENV not in injection.envs or not cards:
        return injection
    names = _resolved(catalog, cards)
    if names is None:
        if strategy == "auto":
            log.debug("CDI names do not resolve for %s; keeping %s", list(cards), ENV)
            return injection
        wanted = ", ".join(f"{KIND}={uuid}" for uuid, _ in cards)
        raise errors.CannotInject(
            f"unresolvable CDI devices {wanted}: no spec in {' or '.join(SPEC_DIRS)} names them; "
            "generate them (nvidia-ctk cdi generate) or use the envvar injection strategy"
        )
    envs = {k: v for k, v in injection.envs.items() if k != ENV}
    annotations = {**injection.annotations, ANNOTATION: ",".join(names)}
    return Injection(
        envs=envs,
        mounts=injection.mounts,
        devices=injection.devices,
        annotations=annotations,
        host_dirs=injection.host_dirs,
    )

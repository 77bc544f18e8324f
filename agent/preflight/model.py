"""The preflight document: one group per manufacturer asked, the runtime used, the topology policy.

Invariants:
- a row's ``reason`` is empty exactly when its state is ``ok`` or ``not-declared``;
- a row is never deeper than what was read back: ``measured`` only with ``evidence``, and
  ``declared`` rows carry no ``command``;
- the exit code is non-zero if and only if some accelerator row is ``unavailable``
  (:func:`exit_code`); detection, runtime and topology blocks never decide it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from kit import rendering

State = Literal["ok", "not-declared", "unavailable"]
Depth = Literal["declared", "simulated", "measured"]
RowMode = Literal["exclusive", "shared", "sliced", "partitioned", "visibility", "unnamed"]

EXIT_UNAVAILABLE = 1


class _Doc(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Base of the document's shapes: camelCase, empty fields omitted."""


class Row(_Doc, frozen=True, kw_only=True):
    """One capability of one accelerator, with how deep this pass established it."""

    accelerator: str
    capability: str
    mode: RowMode
    state: State
    depth: Depth
    detail: str = ""
    reason: str = ""
    command: str = ""
    """The complete invocation (shell-quoted) where a container ran or would have run."""
    evidence: str = ""
    """What the container printed, verbatim; only on ``measured`` rows."""


class HostCheck(_Doc, frozen=True, kw_only=True):
    """The vendor CLI run through the host root, and how many accelerators it counted."""

    command: str
    accelerators: int | None = None
    detail: str = ""
    reason: str = ""


class Detection(_Doc, frozen=True, kw_only=True):
    state: State
    depth: Depth = "declared"
    accelerators: int = 0
    detail: str = ""
    reason: str = ""
    host: HostCheck | None = None


class Group(_Doc, frozen=True, kw_only=True):
    """Everything preflight says about one manufacturer (reported even when nothing was found)."""

    manufacturer: str
    timestamp: str
    detection: Detection
    checks: tuple[Row, ...] = ()
    staging: tuple[str, ...] = ()
    """The library tree and rendered files, as done or (``--dry-run``) as they would be."""
    note: str = ""


class Runtime(_Doc, frozen=True, kw_only=True):
    """Which host runtime drove (or would drive) the probes, and where that was read."""

    name: str = ""
    """``docker`` or ``nerdctl``; empty when nothing can be driven."""
    driven: bool = False
    endpoint: str = ""
    source: str = ""
    host_network: bool | None = None
    """Whether this process shares the host's network namespace; None when it cannot be told."""
    note: str = ""


class Topology(_Doc, frozen=True, kw_only=True):
    timestamp: str
    policy: Literal["none", "best-effort", "restricted", "single-numa-node", "unknown"]
    depth: Depth = "declared"
    source: str = ""
    note: str = ""


class Document(_Doc, frozen=True, kw_only=True):
    accelerators: tuple[Group, ...]
    runtime: Runtime
    topology: Topology


def exit_code(document: Document) -> int:
    """Non-zero iff some accelerator row is ``unavailable``."""
    for group in document.accelerators:
        if any(row.state == "unavailable" for row in group.checks):
            return EXIT_UNAVAILABLE
    return 0


def render(document: Document, fmt: Literal["yaml", "json"]) -> str:
    """The document as YAML (multi-line evidence as ``|`` blocks, so it reads verbatim) or
    JSON: the one renderer every command prints with."""
    return rendering.render(document, fmt)

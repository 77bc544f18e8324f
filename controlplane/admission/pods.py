"""The parts of a Pod admission reads, as typed data, and the JSON Patch it answers with.

Only the fields the request model needs are declared; everything else in the Pod is ignored on
decoding and never re-encoded, because a patch names the paths it changes and leaves the rest of
the object as the API server holds it. Node-selector terms are declared whole (expressions and
fields) because the shared-card pin rewrites the list of terms and must keep what a term says.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kit.values import parse_quantity

__all__ = [
    "Container",
    "PatchOp",
    "Pod",
    "Requirement",
    "Term",
    "container_slots",
    "parse_quantity",
    "pointer",
]


class _Shape(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """Base of the Pod parts: camelCase, unknown fields ignored, absent ones omitted."""


class Resources(_Shape, kw_only=True):
    limits: dict[str, str | int] | None = None
    requests: dict[str, str | int] | None = None


class Container(_Shape, kw_only=True):
    name: str = ""
    resources: Resources | None = None
    restart_policy: str | None = None
    """``Always`` on an init container makes it a native sidecar."""


class Requirement(_Shape, kw_only=True):
    key: str
    operator: str
    values: list[str] | None = None


class Term(_Shape, kw_only=True):
    """One ``nodeSelectorTerms`` entry; terms are ORed, a term's requirements ANDed."""

    match_expressions: list[Requirement] | None = None
    match_fields: list[Requirement] | None = None


class NodeSelector(_Shape, kw_only=True):
    node_selector_terms: list[Term] = []


class NodeAffinity(_Shape, kw_only=True):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class Affinity(_Shape, kw_only=True):
    node_affinity: NodeAffinity | None = None


class PodSpec(_Shape, kw_only=True):
    containers: list[Container] = []
    init_containers: list[Container] | None = None
    node_selector: dict[str, str] | None = None
    affinity: Affinity | None = None


class Pod(_Shape, kw_only=True):
    spec: PodSpec = msgspec.field(default_factory=PodSpec)

    def required_terms(self) -> list[Term] | None:
        """The required node-affinity terms, None when the Pod has no such selector."""
        affinity = self.spec.affinity
        node = affinity.node_affinity if affinity else None
        required = node.required_during_scheduling_ignored_during_execution if node else None
        return None if required is None else required.node_selector_terms


class Slot(msgspec.Struct, frozen=True, kw_only=True):
    """Where a container sits: its field, index, lifetime group and its JSON Pointer."""

    field: str
    """``spec.containers`` or ``spec.initContainers``: the prefix of a message's field path."""
    index: int
    group: str
    """``app``, ``init`` (runs to completion first) or ``sidecar`` (init with restartPolicy
    Always: it overlaps every later container, so it belongs to neither group)."""
    container: Container

    @property
    def path(self) -> str:
        return f"{self.field}[{self.index}]"

    @property
    def pointer(self) -> str:
        return f"/spec/{self.field.removeprefix('spec.')}/{self.index}"


def container_slots(pod: Pod) -> list[Slot]:
    """Every container of the Pod, init containers first (the order the kubelet starts them)."""
    slots = [
        Slot(
            field="spec.initContainers", index=i, container=c,
            group="sidecar" if c.restart_policy == "Always" else "init",
        )
        for i, c in enumerate(pod.spec.init_containers or ())
    ]  # fmt: skip
    slots += [
        Slot(field="spec.containers", index=i, group="app", container=c)
        for i, c in enumerate(pod.spec.containers)
    ]
    return slots


class PatchOp(msgspec.Struct, frozen=True, kw_only=True):
    """One RFC 6902 operation; ``add`` on an existing member replaces it."""

    op: str
    path: str
    value: Any


def pointer(*tokens: str) -> str:
    """A JSON Pointer from raw tokens: ``~`` becomes ``~0`` and ``/`` becomes ``~1``."""
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)

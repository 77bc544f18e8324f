"""``meta.k8s.io/v1`` Tables from printer columns, as kube-apiserver prints a CRD: pure.

A column is a CRD ``additionalPrinterColumns`` entry (``name``, ``type``, ``jsonPath``, optional
``format``, ``description``, ``priority``); its cell is the first value the JSONPath finds.
The JSONPath subset is the one printer columns use: ``.field``, ``[n]``, ``[*]`` and filters
``[?(@.a.b=="x")]`` (also ``!=``, and ``==true``/``==false``/numbers unquoted). A ``date``
column is shown as an age (``5m``, ``3h``, ``12d``) measured against ``now``, as
kube-apiserver's CRD printer does. Every Table has the ``Name`` column first; each row carries
the object as ``PartialObjectMetadata`` (``includeObject=Metadata``, the default), whole
(``Object``) or not at all (``None``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from controlplane.extension.core.failures import bad_request

__all__ = ["Column", "age", "evaluate", "table"]

_STEP: Final = re.compile(
    r"\.([A-Za-z0-9_\-]+)|\[(\*|\d+)\]|\[\?\(@((?:\.[A-Za-z0-9_\-]+)+)\s*(==|!=)\s*([^)]*)\)\]"
)


class Column(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    type: str = "string"
    json_path: str
    format: str = ""
    description: str = ""
    priority: int = 0

    @classmethod
    def from_crd(cls, doc: dict[str, Any]) -> Column:
        return cls(name=doc["name"], type=doc.get("type", "string"), json_path=doc["jsonPath"],
                   format=doc.get("format", ""), description=doc.get("description", ""),
                   priority=int(doc.get("priority", 0)))  # fmt: skip


def _literal(text: str) -> Any:
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        return text.strip("'\"")


def _get(node: Any, dotted: str) -> Any:
    for name in dotted.strip(".").split("."):
        node = node.get(name) if isinstance(node, dict) else None
    return node


def evaluate(obj: Any, path: str) -> list[Any]:
    """Every value ``path`` finds in ``obj`` (the subset above; an unsupported path finds none)."""
    nodes, at = [obj], 0
    while at < len(path):
        step = _STEP.match(path, at)
        if step is None:
            return []
        at = step.end()
        field, index, filtered, op, literal = step.groups()
        found: list[Any] = []
        for node in nodes:
            if field is not None and isinstance(node, dict) and field in node:
                found.append(node[field])
            elif index == "*" and isinstance(node, list):
                found.extend(node)
            elif index is not None and index != "*" and isinstance(node, list):
                found.extend(node[int(index) : int(index) + 1])
            elif filtered is not None and isinstance(node, list):
                want = _literal(literal)
                found.extend(i for i in node if (_get(i, filtered) == want) == (op == "=="))
        nodes = found
    return nodes


def age(timestamp: str, now: datetime) -> str:
    """``5s``, ``7m``, ``3h``, ``12d``, ``2y``: how kubectl shows an age (``<unknown>`` unparsable)."""
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= size):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _cell(obj: dict[str, Any], column: Column, now: datetime) -> Any:
    found = evaluate(obj, column.json_path)
    if not found or found[0] is None:
        return None
    value = found[0]
    if column.type == "date" and isinstance(value, str):
        return age(value, now)
    if column.type in ("string", "date") and not isinstance(value, str):
        return json.dumps(value) if isinstance(value, (dict, list)) else str(value).lower() \
            if isinstance(value, bool) else str(value)  # fmt: skip
    return value


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "Object":
        return obj
    if include == "None":
        return None
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {}}  # fmt: skip


def table(
    objects: Iterable[dict[str, Any]], columns: Iterable[Column], *, include: str = "Metadata",
    now: datetime, list_meta: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The Table of ``objects``. :raises ApiFailure: 400 for an unknown ``includeObject``."""
    if include not in ("None", "Metadata", "Object"):
        raise bad_request(f"includeObject={include!r}: None, Metadata or Object")
    shown = [Column(name="Name", json_path=".metadata.name", format="name",
                    description="the object's name"), *columns]  # fmt: skip
    definitions = [{"name": c.name, "type": "string" if c.type == "date" else c.type,
                    "format": c.format, "description": c.description or c.name,
                    "priority": c.priority} for c in shown]  # fmt: skip
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [_cell(obj, c, now) for c in shown]}
        inner = _row_object(obj, include)
        if inner is not None:
            row["object"] = inner
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {},
            "columnDefinitions": definitions, "rows": rows}  # fmt: skip

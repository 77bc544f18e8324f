"""Server-side apply and managed fields: pure functions over plain objects and schemas.

A *field set* is a frozenset of paths; a path is a tuple of ``fieldsV1`` elements: ``f:<name>``
for an object member, ``k:<json of the key fields>`` for an item of a list the schema marks as
a map list (the path ending at the item stands for the item itself, ``"."`` in ``fieldsV1``).
Any other list, and any scalar, is one leaf: it is owned whole. ``apiVersion``, ``kind`` and
``metadata`` (except ``metadata.labels`` and ``metadata.annotations``) are never owned.

- :func:`apply`: merge an applied configuration into the live object for one field manager:
  a field the applier sets whose live value differs and that another manager owns is a conflict
  (409 naming the manager and the field) unless ``force``, which moves the field to the
  applier; fields the applier applied before and no longer applies are removed unless someone
  else owns them; ownership of equal values is shared;
- :func:`updated`: the managed fields after a PUT or PATCH: the writer (operation ``Update``)
  takes every field whose value changed, from whoever owned it, without conflicts.

``managedFields`` entries are ``metav1.ManagedFieldsEntry`` documents.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any, Final

from controlplane.extension.core.failures import ApiFailure
from controlplane.extension.core.patching import map_keys

__all__ = ["Path", "apply", "fields_of", "from_fields_v1", "to_fields_v1", "updated", "value_at"]

Path = tuple[str, ...]
_MISSING: Final = object()
_UNOWNED_ROOT: Final = ("apiVersion", "kind", "metadata")


def _item_element(item: dict[str, Any], keys: tuple[str, ...]) -> str:
    return "k:" + json.dumps({k: item.get(k) for k in keys}, separators=(",", ":"),
                             sort_keys=True)  # fmt: skip


def _walk(value: Any, schema: dict[str, Any] | None, at: Path) -> set[Path]:
    schema = schema or {}
    if isinstance(value, dict) and value and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out: set[Path] = set()
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for name, sub in value.items():
            child = properties.get(name) or (extra if isinstance(extra, dict) else None)
            out |= _walk(sub, child, (*at, f"f:{name}"))
        return out
    keys = map_keys(schema)
    if isinstance(value, list) and keys and all(isinstance(i, dict) for i in value):
        out = set()
        for item in value:
            here = (*at, _item_element(item, keys))
            out |= {here} | _walk(item, schema.get("items"), here)
        return out
    return {at}


def fields_of(obj: dict[str, Any], schema: dict[str, Any] | None) -> frozenset[Path]:
    """The owned-able fields ``obj`` sets (see the module docstring)."""
    properties = (schema or {}).get("properties") or {}
    out: set[Path] = set()
    for name, value in obj.items():
        if name not in _UNOWNED_ROOT:
            out |= _walk(value, properties.get(name), (f"f:{name}",))
    meta = obj.get("metadata") or {}
    for part in ("labels", "annotations"):
        for key in meta.get(part) or {}:
            out.add(("f:metadata", f"f:{part}", f"f:{key}"))
    return frozenset(out)


def value_at(obj: Any, path: Path) -> Any:
    """The value at ``path`` (a private sentinel when absent)."""
    node = obj
    for element in path:
        if element.startswith("f:") and isinstance(node, dict) and element[2:] in node:
            node = node[element[2:]]
        elif element.startswith("k:") and isinstance(node, list):
            wanted = json.loads(element[2:])
            node = next((i for i in node if isinstance(i, dict)
                         and all(i.get(k) == v for k, v in wanted.items())), _MISSING)  # fmt: skip
            if node is _MISSING:
                return _MISSING
        else:
            return _MISSING
    return node


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    members = set(paths)
    for path in sorted(members):
        node = out
        for element in path:
            node = node.setdefault(element, {})
        if any(p[: len(path)] == path and p != path for p in members):
            node["."] = {}
    return out


def from_fields_v1(doc: dict[str, Any], at: Path = ()) -> frozenset[Path]:
    out: set[Path] = set()
    for element, sub in doc.items():
        if element == ".":
            out.add(at)
            continue
        here = (*at, element)
        inner = from_fields_v1(sub, here) if isinstance(sub, dict) and sub else frozenset()
        out |= inner or {here}
    return frozenset(out)


def _entry(manager: str, operation: str, api_version: str, now: str,
           paths: frozenset[Path]) -> dict[str, Any]:  # fmt: skip
    return {"manager": manager, "operation": operation, "apiVersion": api_version, "time": now,
            "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)}  # fmt: skip


def _owned(managed: list[dict[str, Any]]) -> list[tuple[str, str, frozenset[Path]]]:
    return [(str(m.get("manager", "")), str(m.get("operation", "")),
             from_fields_v1(m.get("fieldsV1") or {})) for m in managed]  # fmt: skip


def _text(path: Path) -> str:
    out = ""
    for element in path:
        out += f".{element[2:]}" if element.startswith("f:") else f"[{element[2:]}]"
    return out


def _remove(obj: dict[str, Any], path: Path) -> None:
    parent = value_at(obj, path[:-1])
    last = path[-1]
    if isinstance(parent, dict) and last.startswith("f:"):
        parent.pop(last[2:], None)
    elif isinstance(parent, list):
        item = value_at(parent, (last,))
        if item is not _MISSING:
            parent.remove(item)


def _merge(live: Any, applied: Any, schema: dict[str, Any] | None) -> Any:
    schema = schema or {}
    if isinstance(live, dict) and isinstance(applied, dict):
        out = dict(live)
        properties = schema.get("properties") or {}
        for name, value in applied.items():
            out[name] = _merge(live.get(name), value, properties.get(name))
        return out
    keys = map_keys(schema)
    if keys and isinstance(live, list) and isinstance(applied, list):
        items = list(live)
        for item in applied:
            element = _item_element(item, keys)
            at = next((i for i, o in enumerate(items)
                       if isinstance(o, dict) and _item_element(o, keys) == element), None)  # fmt: skip
            if at is None:
                items.append(item)
            else:
                items[at] = _merge(items[at], item, schema.get("items"))
        return items
    return copy.deepcopy(applied)


def apply(
    live: dict[str, Any], applied: dict[str, Any], *, manager: str, force: bool,
    schema: dict[str, Any] | None, api_version: str, now: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:  # fmt: skip
    """The object and managed fields after ``manager`` applies ``applied`` to ``live``.

    :raises ApiFailure: 409 Conflict listing every conflicting field and its owner.
    """
    mine = fields_of(applied, schema)
    owners = _owned((live.get("metadata") or {}).get("managedFields") or [])
    conflicts = sorted(
        (m, p) for m, op, paths in owners if not (m == manager and op == "Apply")
        for p in mine & paths
        if not p[-1].startswith("k:") and value_at(live, p) != value_at(applied, p)
    )  # fmt: skip
    if conflicts and not force:
        causes = [{"reason": "FieldManagerConflict", "field": _text(p),
                   "message": f'conflict with "{m}": {_text(p)}'} for m, p in conflicts]  # fmt: skip
        text = "; ".join(c["message"] for c in causes)
        raise ApiFailure(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s): {text}",
                         details={"causes": causes})  # fmt: skip
    taken = {p for _, p in conflicts}
    before = next((paths for m, op, paths in owners if m == manager and op == "Apply"), frozenset())
    others = frozenset().union(*(paths for m, op, paths in owners
                                 if not (m == manager and op == "Apply")))  # fmt: skip
    out = copy.deepcopy(live)
    for path in sorted(before - mine - others, key=len, reverse=True):
        _remove(out, path)
    out = _merge(out, {k: v for k, v in applied.items() if k not in ("apiVersion", "kind")}, schema)
    managed = [_entry(manager, "Apply", api_version, now, mine)]
    for m, op, paths in owners:
        if not (m == manager and op == "Apply") and paths - taken:
            managed.append(_entry(m, op, api_version, now, frozenset(paths - taken)))
    return out, managed


def updated(
    old: dict[str, Any], new: dict[str, Any], *, manager: str,
    schema: dict[str, Any] | None, api_version: str, now: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """The managed fields after ``manager`` turned ``old`` into ``new`` with a PUT or PATCH."""
    before, after = fields_of(old, schema), fields_of(new, schema)
    changed = frozenset(p for p in before | after if value_at(old, p) != value_at(new, p))
    owners = _owned((old.get("metadata") or {}).get("managedFields") or [])
    managed, mine = [], changed & after
    for m, op, paths in owners:
        if m == manager and op == "Update":
            mine = mine | (paths & after)
            continue
        kept = (paths - changed) & after
        if kept:
            managed.append(_entry(m, op, api_version, now, frozenset(kept)))
    if mine:
        managed.append(_entry(manager, "Update", api_version, now, frozenset(mine)))
    return managed

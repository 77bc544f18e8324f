"""Patches, applied to plain JSON documents: pure functions, inputs never mutated.

- :func:`json_patch`: RFC 6902 (``application/json-patch+json``): add, remove, replace, move,
  copy, test, RFC 6901 pointers (``~0``, ``~1``, ``-`` to append);
- :func:`merge_patch`: RFC 7386 (``application/merge-patch+json``): objects merge, ``null``
  removes, anything else replaces;
- :func:`strategic_merge_patch` (``application/strategic-merge-patch+json``) where the type
  allows: a merge patch whose lists the schema marks ``x-kubernetes-list-type: map`` merge item
  by item on their ``x-kubernetes-list-map-keys`` (an item ``{"$patch": "delete", <keys>}``
  removes one); every other list is replaced, as for a CRD's atomic lists.

A malformed patch is a 400; a well-formed one that does not apply (a ``test`` that fails, a
path that is not there) a 422, as kube-apiserver answers.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from controlplane.extension.core.failures import ApiFailure, bad_request

__all__ = ["json_patch", "map_keys", "merge_patch", "strategic_merge_patch"]

_OPS: Final = ("add", "remove", "replace", "move", "copy", "test")


def _unapplied(message: str) -> ApiFailure:
    return ApiFailure(422, "Invalid", f"the JSON patch does not apply: {message}")


def _pointer(text: str) -> list[str]:
    if text == "":
        return []
    if not text.startswith("/"):
        raise bad_request(f"JSON patch path {text!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in text[1:].split("/")]


def _index(parent: list[Any], token: str, *, adding: bool) -> int:
    if adding and token == "-":
        return len(parent)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise _unapplied(f"{token!r} is not an array index")
    index = int(token)
    if index > len(parent) or (not adding and index == len(parent)):
        raise _unapplied(f"index {index} is out of range")
    return index


def _parent(doc: Any, path: list[str]) -> Any:
    node = doc
    for token in path[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, adding=False)]
        else:
            raise _unapplied(f"/{'/'.join(path)}: no such path")
    return node


def _get(doc: Any, path: list[str]) -> Any:
    if not path:
        return doc
    parent, last = _parent(doc, path), path[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, adding=False)]
    raise _unapplied(f"/{'/'.join(path)}: no such path")


def _remove(doc: Any, path: list[str]) -> Any:
    if not path:
        raise _unapplied("the whole document cannot be removed")
    parent, last = _parent(doc, path), path[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, adding=False))
    raise _unapplied(f"/{'/'.join(path)}: no such path")


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent, last = _parent(doc, path), path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, adding=True), value)
    else:
        raise _unapplied(f"/{'/'.join(path)}: the parent is not an object or array")
    return doc


def _operation(doc: Any, op: Any) -> Any:
    if not isinstance(op, dict) or op.get("op") not in _OPS or not isinstance(op.get("path"), str):
        raise bad_request(f"not a JSON patch operation: {op!r}")
    kind, path = op["op"], _pointer(op["path"])
    if kind in ("add", "replace", "test") and "value" not in op:
        raise bad_request(f"JSON patch {kind} of {op['path']!r} has no value")
    if kind in ("move", "copy") and not isinstance(op.get("from"), str):
        raise bad_request(f"JSON patch {kind} to {op['path']!r} has no 'from'")
    if kind == "test":
        if _get(doc, path) != op["value"]:
            raise _unapplied(f"test of {op['path']!r} failed")
        return doc
    if kind == "remove":
        _remove(doc, path)
        return doc
    if kind == "replace":
        _get(doc, path)  # must exist
        if not path:
            return copy.deepcopy(op["value"])
        _remove(doc, path)
        return _add(doc, path, copy.deepcopy(op["value"]))
    if kind == "add":
        return _add(doc, path, copy.deepcopy(op["value"]))
    source = _pointer(op["from"])
    if kind == "move" and source == path:
        _get(doc, source)  # a move onto itself is a no-op, when the value exists
        return doc
    if kind == "move" and path[: len(source)] == source:
        raise _unapplied(f"cannot move {op['from']!r} into itself")
    value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
    return _add(doc, path, value)


def json_patch(doc: dict[str, Any], patch: Any) -> Any:
    """``doc`` with the RFC 6902 ``patch`` applied. :raises ApiFailure: 400 or 422."""
    if not isinstance(patch, list):
        raise bad_request("a JSON patch is an array of operations")
    out: Any = copy.deepcopy(doc)
    for op in patch:
        out = _operation(out, op)
    return out


def merge_patch(doc: Any, patch: Any) -> Any:
    """``doc`` with the RFC 7386 ``patch`` applied."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return copy.deepcopy(out)


def map_keys(schema: dict[str, Any] | None) -> tuple[str, ...]:
    """The item keys of a list the schema marks as a map list (empty: an atomic list)."""
    if not schema or schema.get("x-kubernetes-list-type") != "map":
        return ()
    return tuple(schema.get("x-kubernetes-list-map-keys") or ())


def _item_key(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...]:
    if not isinstance(item, dict):
        raise bad_request(f"a list item keyed by {', '.join(keys)} must be an object")
    return tuple(item.get(k) for k in keys)


def _merge_list(doc: Any, patch: list[Any], schema: dict[str, Any]) -> list[Any]:
    keys = map_keys(schema)
    items = list(doc) if isinstance(doc, list) else []
    for change in patch:
        key = _item_key(change, keys)
        at = next((i for i, o in enumerate(items) if _item_key(o, keys) == key), None)
        if isinstance(change, dict) and change.get("$patch") == "delete":
            if at is not None:
                items.pop(at)
            continue
        if at is None:
            items.append(strategic_merge_patch(None, change, schema.get("items")))
        else:
            items[at] = strategic_merge_patch(items[at], change, schema.get("items"))
    return items


def strategic_merge_patch(doc: Any, patch: Any, schema: dict[str, Any] | None) -> Any:
    """``doc`` with a strategic merge ``patch`` applied, guided by ``schema`` (see above)."""
    if isinstance(patch, list):
        if schema is not None and map_keys(schema):
            return _merge_list(doc, patch, schema)
        return copy.deepcopy(patch)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if any(k.startswith("$") for k in patch):
        raise bad_request(f"unsupported strategic merge directive in {sorted(patch)!r}")
    out = dict(doc) if isinstance(doc, dict) else {}
    properties = (schema or {}).get("properties") or {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = strategic_merge_patch(out.get(key), value, properties.get(key))
    return copy.deepcopy(out)

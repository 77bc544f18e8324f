"""Unknown-field checks of a written object against its schema: pure.

What ``fieldValidation`` decides (``Strict``: refuse with 400 naming every unknown field;
``Warn``: accept and warn; ``Ignore``: nothing) and how unknown fields are found: every member
of an object whose schema lists ``properties`` and allows nothing else
(no ``additionalProperties``, no ``x-kubernetes-preserve-unknown-fields``); ``metadata``
against ``ObjectMeta``'s members.
"""

from __future__ import annotations

from typing import Any, Final

from controlplane.extension.core.failures import bad_request

__all__ = ["check_fields", "unknown_fields"]

_META: Final = frozenset({
    "name", "generateName", "namespace", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields", "selfLink",
})  # fmt: skip


def _walk(value: Any, schema: dict[str, Any], at: str) -> list[str]:
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [p for i, item in enumerate(value)
                for p in _walk(item, schema["items"], f"{at}[{i}]")]  # fmt: skip
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    out = []
    for name, sub in value.items():
        here = f"{at}.{name}" if at else name
        if properties is not None and name in properties:
            out += _walk(sub, properties[name], here)
        elif isinstance(extra, dict):
            out += _walk(sub, extra, here)
        elif properties is not None and extra is None:
            out.append(here)
    return out


def unknown_fields(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Dotted paths of the members ``schema`` does not know."""
    root = {**schema, "properties": {**(schema.get("properties") or {}), "apiVersion": {},
                                     "kind": {}, "metadata": {}}}  # fmt: skip
    out = [f"metadata.{k}" for k in (obj.get("metadata") or {}) if k not in _META]
    return out + _walk(obj, root, "")


def check_fields(obj: dict[str, Any], schema: dict[str, Any], directive: str) -> list[str]:
    """The warnings for ``fieldValidation=directive``. :raises ApiFailure: 400 when Strict."""
    if directive not in ("", "Ignore", "Warn", "Strict"):
        raise bad_request(f"fieldValidation={directive!r}: Ignore, Warn or Strict")
    if directive in ("", "Ignore"):
        return []
    unknown = unknown_fields(obj, schema)
    if unknown and directive == "Strict":
        raise bad_request("strict decoding error: " + ", ".join(
            f'unknown field "{p}"' for p in unknown))  # fmt: skip
    return [f'unknown field "{p}"' for p in unknown]

"""What a create, update or patch turns an object into, and whether it may: pure.

:func:`decode` reads a body (JSON; YAML for server-side apply); :func:`planned` computes the
object to store and its managed fields:

- **optimistic concurrency on every write**: a body (PUT) or patch result (PATCH) whose
  ``metadata.resourceVersion`` is set and differs from the live object's is a 409 Conflict,
  whatever the patch type; an unset one writes unconditionally (as for Kubernetes' own kinds
  that allow it);
- a body naming another object than the URL (``metadata.name``, ``metadata.namespace``) is a
  400, as is one of another ``apiVersion``/``kind``;
- server-side apply (``application/apply-patch+yaml``) needs ``fieldManager``; conflicts are
  409 unless ``force=true`` (:func:`~controlplane.extension.core.ssa.apply`);
- ``fieldValidation`` (``Strict``/``Warn``/``Ignore``) is applied to the body
  (:mod:`~controlplane.extension.core.validation`).

The returned object keeps the live ``metadata`` the client may not change (uid, creation
time, resourceVersion); the cache stamps the new version once the provider stored it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import yaml

from controlplane.extension.core import patching, ssa
from controlplane.extension.core.failures import ApiFailure, bad_request, conflict
from controlplane.extension.core.model import GroupVersion, ResourceSpec
from controlplane.extension.core.validation import check_fields

__all__ = ["APPLY", "PATCH_TYPES", "Plan", "Write", "decode", "planned"]

APPLY: Final = "application/apply-patch+yaml"
PATCH_TYPES: Final = (
    "application/json-patch+json", "application/merge-patch+json",
    "application/strategic-merge-patch+json", APPLY,
)  # fmt: skip
_KEPT: Final = ("uid", "creationTimestamp", "resourceVersion", "managedFields")


class Write(msgspec.Struct, frozen=True, kw_only=True):
    """One write request, as the HTTP layer read it."""

    verb: str
    """create, update or patch."""
    content_type: str
    name: str
    namespace: str
    query: Mapping[str, str]
    manager: str
    """The field manager (``fieldManager``, or derived from the User-Agent)."""
    now: str


class Plan(msgspec.Struct, frozen=True):
    obj: dict[str, Any]
    managed: list[dict[str, Any]]
    warnings: list[str]


def decode(body: bytes, content_type: str) -> Any:
    """The body as a document. :raises ApiFailure: 400 unreadable, 415 unsupported type."""
    try:
        if content_type == APPLY or content_type.endswith("yaml"):
            return yaml.safe_load(body.decode())
        if content_type in ("application/json", "", "application/octet-stream", *PATCH_TYPES):
            # octet-stream: what ``kubectl replace --raw`` sends
            return json.loads(body)
    except (ValueError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not a readable document: {e}") from None
    raise ApiFailure(415, "UnsupportedMediaType",
                     f"the body of type {content_type!r} is not supported")  # fmt: skip


def _identity(gv: GroupVersion, r: ResourceSpec, doc: Any, name: str, namespace: str) -> None:
    if not isinstance(doc, dict):
        raise bad_request("the object is not a JSON object")
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if api_version not in (None, gv.group_version) or kind not in (None, r.kind):
        raise bad_request(f"the object is {api_version}/{kind}, not {gv.group_version}/{r.kind}")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, dict):
        raise bad_request("metadata is not an object")
    if meta.get("name") not in (None, "", name):
        raise bad_request(f"the name of the object ({meta['name']}) does not match the name on "
                          f"the URL ({name})")  # fmt: skip
    if r.namespaced and meta.get("namespace") not in (None, "", namespace):
        raise bad_request(f"the namespace of the object ({meta['namespace']}) does not match "
                          f"the namespace on the request ({namespace})")  # fmt: skip


def _patched(r: ResourceSpec, live: dict[str, Any], patch: Any, content_type: str) -> Any:
    if content_type == "application/json-patch+json":
        return patching.json_patch(live, patch)
    if not isinstance(patch, dict):
        raise bad_request(f"a {content_type} body must be a JSON object")
    if content_type == "application/merge-patch+json":
        return patching.merge_patch(live, patch)
    return patching.strategic_merge_patch(live, patch, r.schema)


def _finish(gv: GroupVersion, r: ResourceSpec, live: dict[str, Any] | None,
            new: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:  # fmt: skip
    meta = dict(new.get("metadata") or {})
    wanted = meta.get("resourceVersion")
    if live is not None:
        current = live["metadata"]["resourceVersion"]
        if wanted not in (None, "", current):
            raise conflict(gv.group, r.plural, name, "the object has been modified; please "
                           "apply your changes to the latest version and try again")  # fmt: skip
        meta.update({k: live["metadata"][k] for k in _KEPT if k in live["metadata"]})
    meta["name"] = name
    if r.namespaced:
        meta["namespace"] = namespace
    return {**new, "apiVersion": gv.group_version, "kind": r.kind, "metadata": meta}


def planned(
    gv: GroupVersion, r: ResourceSpec, live: dict[str, Any] | None, doc: Any, w: Write
) -> Plan:
    """The object ``w.verb`` (create, update, patch) makes of ``live`` with ``doc``.

    :raises ApiFailure: 400, 404 (patching nothing), 409 (stale version, apply conflict), 415.
    """
    verb, content_type, name, namespace, query = (w.verb, w.content_type, w.name, w.namespace,
                                                  w.query)  # fmt: skip
    directive = query.get("fieldValidation", "")
    warnings = check_fields(doc, r.schema, directive) if isinstance(doc, dict) and (
        verb != "patch" or content_type == APPLY) else []  # fmt: skip
    if verb == "patch" and content_type not in PATCH_TYPES:
        raise ApiFailure(415, "UnsupportedMediaType", f"the patch type {content_type!r} is not "
                         f"one of {', '.join(PATCH_TYPES)}")  # fmt: skip
    if verb == "patch" and content_type == APPLY:
        if not query.get("fieldManager"):
            raise bad_request("fieldManager is required for apply patch")
        _identity(gv, r, doc, name, namespace)
        force = query.get("force", "") in ("true", "1")
        obj, managed = ssa.apply(live or {}, doc, manager=query["fieldManager"], force=force,
                                 schema=r.schema, api_version=gv.group_version, now=w.now)  # fmt: skip
        return Plan(_finish(gv, r, live, obj, name, namespace), managed, warnings)
    if verb == "patch":
        if live is None:
            raise bad_request("cannot patch an object that does not exist")
        doc = _patched(r, live, doc, content_type)
        if isinstance(doc, dict):  # what the patch brought in, checked on the result
            warnings = check_fields(doc, r.schema, directive)
    _identity(gv, r, doc, name, namespace)
    obj = _finish(gv, r, live, doc, name, namespace)
    managed = ssa.updated(live or {}, obj, manager=w.manager, schema=r.schema,
                          api_version=gv.group_version, now=w.now)  # fmt: skip
    return Plan(obj, managed, warnings)

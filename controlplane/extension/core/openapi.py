"""OpenAPI v2 (Swagger 2.0) and v3 documents for the served group versions: pure.

Both are built from each :class:`~controlplane.extension.core.model.ResourceSpec`'s schema,
the same schema dicts the CRDs carry, so ``kubectl explain`` shows the same text for a view
and its stored object. Every kind's schema carries ``x-kubernetes-group-version-kind`` (what
``kubectl explain`` and the aggregator look up) and references the ``ObjectMeta`` definition
given here; every operation carries ``x-kubernetes-action`` and its group-version-kind, and the
writes declare the ``fieldValidation`` query parameter, which is how ``kubectl`` learns to send
``fieldValidation=Strict`` and leave validation to the server (it then never needs the v2
protobuf document, which is not served: ``/openapi/v2`` answers JSON only).

v3 is split per group version, as kube-apiserver serves it: ``/openapi/v3`` is the index
(:func:`v3_index`, each entry's ``serverRelativeURL`` carrying the document's hash, which makes
that URL cacheable forever), ``/openapi/v3/apis/<group>/<version>`` the document.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from typing import Any, Final

from controlplane.extension.core.model import GroupVersion, ResourceSpec

__all__ = ["META", "definition_name", "v2_document", "v3_document", "v3_index"]

META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1"

_S: Final = {"type": "string"}


def _d(schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {**schema, "description": text}


def _meta_definitions() -> dict[str, dict[str, Any]]:
    """The few ``meta/v1`` definitions the kinds reference (with what each field means)."""
    string_map = {"type": "object", "additionalProperties": _S}
    object_meta = {
        "type": "object",
        "description": "Standard object metadata: what every persisted object has.",
        "properties": {
            "name": _d(_S, "The object's name, unique in its namespace (or cluster)."),
            "namespace": _d(_S, "The namespace of a namespaced object."),
            "uid": _d(_S, "Unique in time and space; stable for the object's life."),
            "resourceVersion": _d(_S, "Opaque version of this state: send it back to write "
                                      "conditionally, or to list and watch from it."),
            "generation": _d({"type": "integer", "format": "int64"},
                             "A sequence number of the desired state."),
            "creationTimestamp": _d({"type": "string", "format": "date-time"},
                                    "When the object was created (RFC 3339, UTC)."),
            "deletionTimestamp": _d({"type": "string", "format": "date-time"},
                                    "When a graceful deletion was asked for."),
            "labels": _d(string_map, "Key/value pairs to select and organize objects."),
            "annotations": _d(string_map, "Unstructured key/value data for tools."),
            "finalizers": _d({"type": "array", "items": _S},
                             "What must finish before the object is deleted."),
            "managedFields": _d({"type": "array", "items": {"type": "object"}},
                                "Which field manager owns which fields (server-side apply)."),
            "ownerReferences": _d({"type": "array", "items": {"type": "object"}},
                                  "Objects this one depends on."),
        },
    }  # fmt: skip
    list_meta = {
        "type": "object",
        "description": "Standard list metadata.",
        "properties": {
            "resourceVersion": _d(_S, "The version of the state the list shows."),
            "continue": _d(_S, "Pass as ?continue= to get the next page (opaque)."),
            "remainingItemCount": _d({"type": "integer", "format": "int64"},
                                     "Items after this page, when known."),
        },
    }  # fmt: skip
    status = {
        "type": "object",
        "description": "The result of a call that returns no object: why it failed.",
        "properties": {"apiVersion": _S, "kind": _S, "status": _S, "message": _S, "reason": _S,
                       "code": {"type": "integer", "format": "int32"},
                       "details": {"type": "object"}, "metadata": {"type": "object"}},
    }  # fmt: skip
    return {
        f"{META}.ObjectMeta": object_meta,
        f"{META}.ListMeta": list_meta,
        f"{META}.Status": status,
        f"{META}.Patch": {"type": "object", "description": "A patch of one of the accepted "
                          "patch types (JSON, merge, strategic merge, apply)."},
    }  # fmt: skip


def definition_name(group: str, version: str, kind: str) -> str:
    """``ai.gpustack.v1.Setting``: the reversed group, the version, the kind (as Kubernetes)."""
    return ".".join([*reversed(group.split(".")), version, kind])


def _gvk(gv: GroupVersion, kind: str) -> list[dict[str, str]]:
    return [{"group": gv.group, "version": gv.version, "kind": kind}]


def _kind_schema(gv: GroupVersion, r: ResourceSpec, ref: str) -> dict[str, Any]:
    out = copy.deepcopy(r.schema)
    out.setdefault("type", "object")
    out.setdefault("description", f"A {r.kind} of {gv.group_version}.")
    props = out.setdefault("properties", {})
    props["apiVersion"] = _d(_S, f"The versioned schema of this object ({gv.group_version}).")
    props["kind"] = _d(_S, f"The REST resource this object represents ({r.kind}).")
    props["metadata"] = {"allOf": [{"$ref": f"{ref}{META}.ObjectMeta"}], "default": {},
                         "description": "Standard object metadata."}  # fmt: skip
    out["x-kubernetes-group-version-kind"] = _gvk(gv, r.kind)
    return out


def _list_schema(gv: GroupVersion, r: ResourceSpec, ref: str) -> dict[str, Any]:
    return {
        "type": "object", "required": ["items"],
        "description": f"A list of {r.kind}.",
        "properties": {
            "apiVersion": _d(_S, "The versioned schema of this list."),
            "kind": _d(_S, f"{r.kind}List."),
            "metadata": {"allOf": [{"$ref": f"{ref}{META}.ListMeta"}], "default": {},
                         "description": "Standard list metadata."},
            "items": {"type": "array", "description": f"The {r.plural}.",
                      "items": {"allOf": [{"$ref": ref + definition_name(
                          gv.group, gv.version, r.kind)}], "default": {}}},
        },
        "x-kubernetes-group-version-kind": _gvk(gv, f"{r.kind}List"),
    }  # fmt: skip


def _query(name: str, text: str, kind: str = "string", *, v3: bool) -> dict[str, Any]:
    schema = {"type": kind, "uniqueItems": True} if kind else {}
    out: dict[str, Any] = {"name": name, "in": "query", "description": text}
    if v3:
        out["schema"] = schema
    else:
        out.update(schema)
    return out


_LIST_PARAMS: Final = (
    ("labelSelector", "Select by labels (=, ==, !=, in, notin, exists, !).", "string"),
    ("fieldSelector", "Select by fields: metadata.name, metadata.namespace.", "string"),
    ("limit", "At most this many items; the list's metadata.continue gets the rest.", "integer"),
    ("continue", "The token of the previous page.", "string"),
    ("resourceVersion", "List or watch from this version (see resourceVersionMatch).", "string"),
    ("resourceVersionMatch", "Exact or NotOlderThan.", "string"),
    ("watch", "Stream the changes as watch events.", "boolean"),
    ("allowWatchBookmarks", "Send BOOKMARK events.", "boolean"),
    (
        "sendInitialEvents",
        "Send the current objects first, then an initial-events-end BOOKMARK.",
        "boolean",
    ),
    ("timeoutSeconds", "End a watch after this many seconds.", "integer"),
)
_WRITE_PARAMS: Final = (
    ("dryRun", "All: validate and answer without storing.", "string"),
    ("fieldManager", "The name of the actor making the change.", "string"),
    ("fieldValidation", "Ignore, Warn or Strict: what to do with unknown fields.", "string"),
)


def _operation(gv: GroupVersion, kind: str, names: tuple[str, str], body_ref: str | None,
               params: Sequence[tuple[str, str, str]], *, v3: bool, ref: str,
               patch: bool = False) -> dict[str, Any]:  # fmt: skip
    action, op_id = names
    out: dict[str, Any] = {
        "operationId": op_id, "tags": [gv.group_version],
        "x-kubernetes-action": action, "x-kubernetes-group-version-kind": _gvk(gv, kind)[0],
        "parameters": [_query(n, t, k, v3=v3) for n, t, k in params],
    }  # fmt: skip
    body_types = ["application/json"]
    if patch:
        body_types = [
            "application/apply-patch+yaml",
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ]
        out["parameters"].append(_query("force", "Apply: take conflicting fields.", "boolean",
                                        v3=v3))  # fmt: skip
    schema_ref = {"$ref": ref + body_ref} if body_ref else None
    ok_ref = {"$ref": ref + definition_name(gv.group, gv.version, kind)}
    if v3:
        if schema_ref and action in ("put", "patch", "post"):
            out["requestBody"] = {"content": {t: {"schema": schema_ref} for t in body_types},
                                  "required": True}  # fmt: skip
        out["responses"] = {"200": {"description": "OK", "content": {
            "application/json": {"schema": ok_ref}}}}  # fmt: skip
    else:
        if schema_ref and action in ("put", "patch", "post"):
            out["parameters"].append({"name": "body", "in": "body", "required": True,
                                      "schema": schema_ref})  # fmt: skip
            out["consumes"] = body_types
        out["produces"] = ["application/json"]
        out["responses"] = {"200": {"description": "OK", "schema": ok_ref}}
    return out


def _paths(gv: GroupVersion, r: ResourceSpec, *, v3: bool, ref: str) -> dict[str, Any]:
    base = f"/apis/{gv.group}/{gv.version}"
    scoped = f"{base}/namespaces/{{namespace}}/{r.plural}" if r.namespaced else f"{base}/{r.plural}"
    path_param = {"in": "path", "required": True, "uniqueItems": True}
    name_p = {**path_param, "name": "name", "description": f"The {r.singular}'s name."}
    ns_p = {**path_param, "name": "namespace", "description": "The namespace."}
    if v3:
        name_p, ns_p = ({**p, "schema": {"type": "string"}} for p in (name_p, ns_p))
    else:
        name_p, ns_p = ({**p, "type": "string"} for p in (name_p, ns_p))
    scope = [ns_p] if r.namespaced else []
    kind, own = r.kind, definition_name(gv.group, gv.version, r.kind)
    collection: dict[str, Any] = {"parameters": scope}
    item: dict[str, Any] = {"parameters": [name_p, *scope]}
    if "list" in r.verbs:
        collection["get"] = _operation(gv, f"{kind}List", ("list", f"list{kind}"), None,
                                       _LIST_PARAMS, v3=v3, ref=ref)  # fmt: skip
    if "create" in r.verbs:
        collection["post"] = _operation(gv, kind, ("post", f"create{kind}"), own, _WRITE_PARAMS,
                                        v3=v3, ref=ref)  # fmt: skip
    verbs = {"get": ("get", "read", None, ()), "update": ("put", "replace", own, _WRITE_PARAMS),
             "patch": ("patch", "patch", f"{META}.Patch", _WRITE_PARAMS),
             "delete": ("delete", "delete", None, (("dryRun", "All: do not delete.", "string"),))}  # fmt: skip
    for verb, (method, prefix, body, params) in verbs.items():
        if verb in r.verbs:
            item[method] = _operation(gv, kind, (method if verb != "update" else "put", f"{prefix}{kind}"), body, params, v3=v3, ref=ref,
                                      patch=verb == "patch")  # fmt: skip
    out = {scoped: collection, f"{scoped}/{{name}}": item}
    if r.namespaced and "list" in r.verbs:
        out[f"{base}/{r.plural}"] = {"get": _operation(gv, f"{kind}List", ("list", f"list{kind}ForAllNamespaces"), None, _LIST_PARAMS,
            v3=v3, ref=ref)}  # fmt: skip
    for sub in r.subresources:
        out[f"{scoped}/{{name}}/{sub.name}"] = {"parameters": [name_p, *scope], "get": _operation(gv, kind, ("get", f"read{kind}{sub.name.capitalize()}"), None, (), v3=v3, ref=ref)}  # fmt: skip
    return out


def _document(gvs: Sequence[GroupVersion], *, v3: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    ref = "#/components/schemas/" if v3 else "#/definitions/"
    definitions = _meta_definitions()
    paths: dict[str, Any] = {}
    for gv in gvs:
        for r in gv.resources:
            definitions[definition_name(gv.group, gv.version, r.kind)] = _kind_schema(gv, r, ref)
            definitions[definition_name(gv.group, gv.version, f"{r.kind}List")] = _list_schema(
                gv, r, ref)  # fmt: skip
            paths.update(_paths(gv, r, v3=v3, ref=ref))
    return definitions, paths


def v2_document(gvs: Sequence[GroupVersion]) -> dict[str, Any]:
    """``/openapi/v2``: every served group version in one Swagger 2.0 document."""
    definitions, paths = _document(gvs, v3=False)
    return {"swagger": "2.0", "info": {"title": "gpustack-operator worker", "version": "v1"},
            "paths": paths, "definitions": definitions}  # fmt: skip


def v3_document(gv: GroupVersion) -> dict[str, Any]:
    """``/openapi/v3/apis/<group>/<version>``."""
    schemas, paths = _document([gv], v3=True)
    return {"openapi": "3.0.0", "info": {"title": "gpustack-operator worker", "version": "v1"},
            "paths": paths, "components": {"schemas": schemas}}  # fmt: skip


def encoded(doc: dict[str, Any]) -> tuple[bytes, str]:
    """The document's JSON and its hash (SHA-512, upper-case hex, as Kubernetes writes it)."""
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return body, hashlib.sha512(body).hexdigest().upper()


def v3_index(gvs: Sequence[GroupVersion]) -> dict[str, Any]:
    """``/openapi/v3``: where each group version's document is, with its hash."""
    paths = {}
    for gv in gvs:
        _, digest = encoded(v3_document(gv))
        relative = f"apis/{gv.group}/{gv.version}"
        paths[relative] = {"serverRelativeURL": f"/openapi/v3/{relative}?hash={digest}"}
    return {"paths": paths}

"""Which resource request a path and method are: pure.

``/apis/<group>/<version>[/namespaces/<ns>]/<plural>[/<name>[/<subresource>]]``; the verb as
Kubernetes authorizes it: ``get``, ``list``, ``watch`` (``?watch`` other than ``0``/``false``),
``create`` (POST), ``update`` (PUT), ``patch`` (PATCH, server-side apply included), ``delete``,
``deletecollection``. A path under a served group that names no resource is a 404 with
``details``; discovery paths are not routes (:func:`route` answers None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from controlplane.extension.core.failures import ApiFailure
from controlplane.extension.core.model import GroupVersion, ResourceSpec

__all__ = ["Route", "is_discovery", "route"]


class Route(msgspec.Struct, frozen=True, kw_only=True):
    gv: GroupVersion
    resource: ResourceSpec
    verb: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""


def is_discovery(gvs: Sequence[GroupVersion], path: str) -> bool:
    path = path.rstrip("/")
    served = {"/apis"} | {f"/apis/{gv.group}" for gv in gvs}
    return path in served | {f"/apis/{gv.group_version}" for gv in gvs}


def _verb(method: str, name: str, watch: bool) -> str | None:
    if method in ("GET", "HEAD"):
        return "get" if name else ("watch" if watch else "list")
    by_method = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    verb = by_method.get(method)
    if verb is None or (verb == "create") == bool(name):
        return None if verb != "delete" else "deletecollection"
    return verb


def _missing(path: str) -> ApiFailure:
    return ApiFailure(404, "NotFound", f"the server could not find the requested resource "
                      f"({path})", details={"causes": [{"reason": "UnexpectedServerResponse",
                                                        "message": "404 page not found"}]})  # fmt: skip


def route(
    gvs: Sequence[GroupVersion], path: str, method: str, query: Mapping[str, str]
) -> Route | None:
    """The request a resource path is, None for discovery. :raises ApiFailure: 404, 405."""
    if is_discovery(gvs, path):
        return None
    for gv in gvs:
        prefix = f"/apis/{gv.group_version}/"
        if path.startswith(prefix):
            break
    else:
        raise _missing(path)
    parts = path[len(prefix) :].rstrip("/").split("/")
    namespace = ""
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    resource = gv.resource(parts[0]) if 1 <= len(parts) <= 3 and all(parts) else None
    if resource is None or (namespace and not resource.namespaced):
        raise _missing(path)
    name = parts[1] if len(parts) >= 2 else ""
    sub = parts[2] if len(parts) == 3 else ""
    if sub and sub not in {s.name for s in resource.subresources}:
        raise _missing(path)
    watch = query.get("watch", "") not in ("", "0", "false")
    verb = _verb(method, name, watch)
    if verb is None or (sub and verb != "get"):
        raise ApiFailure(405, "MethodNotAllowed",
                         "the server does not allow this method on the requested resource",
                         details={"group": gv.group, "kind": resource.plural, "name": name})  # fmt: skip
    return Route(gv=gv, resource=resource, verb=verb, namespace=namespace, name=name,
                 subresource=sub)  # fmt: skip

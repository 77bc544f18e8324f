"""What the core serves, declared as data: a group version and its resources.

:class:`ResourceSpec` is everything the core needs to serve a resource besides its objects:
names (plural, singular, kind, short names, categories), scope, verbs, the
``openAPIV3Schema`` (the same typed schema dicts the CRDs are built from, described as
:func:`controlplane.schema.crddocs.describe` does) from which OpenAPI v2/v3, strict field validation,
strategic merge and server-side apply all read; printer columns; extra field-selector paths;
subresources.

:class:`Provider` is what backs a resource (a settings store, an informer's cache, a bus
ledger): the objects now, a way to wait for a change, and the writes. The core does everything
else (versions, selectors, paging, watch, patches, apply, conflicts, tables, OpenAPI).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

import msgspec

from controlplane.extension.core.tables import Column

__all__ = ["GroupVersion", "Provider", "ResourceSpec", "Subresource", "Versioned", "from_crd"]

READ_VERBS = ("get", "list", "watch")


class Subresource(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    kind: str
    verbs: tuple[str, ...] = ("get",)
    schema: dict[str, Any] = msgspec.field(default_factory=dict)


class ResourceSpec(msgspec.Struct, frozen=True, kw_only=True):
    plural: str
    singular: str
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    """Of get, list, watch, create, update, patch, delete (apply is patch)."""
    schema: dict[str, Any]
    """The object's ``openAPIV3Schema`` (``apiVersion``, ``kind``, ``metadata`` may be absent)."""
    short: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()
    """Printer columns after ``Name`` (an ``Age`` column is added last)."""
    field_paths: tuple[str, ...] = ()
    """Field-selector paths besides ``metadata.name`` and ``metadata.namespace``."""
    subresources: tuple[Subresource, ...] = ()

    def allows_field(self, path: str) -> bool:
        return path in ("metadata.name", "metadata.namespace", *self.field_paths)


def from_crd(
    crd: dict[str, Any], *, verbs: tuple[str, ...], field_paths: tuple[str, ...] = (),
    subresources: tuple[Subresource, ...] = (), version: int = 0,
) -> ResourceSpec:  # fmt: skip
    """The spec of a resource that serves a view of a CRD's objects: its names, scope, schema
    and printer columns (``Age`` left to the core) from the ``CustomResourceDefinition`` dict
    (``versions[version]``); ``verbs`` and the rest are the view's own."""
    spec, names = crd["spec"], crd["spec"]["names"]
    served = spec["versions"][version]
    columns = tuple(Column.from_crd(c) for c in served.get("additionalPrinterColumns") or ()
                    if c.get("jsonPath") != ".metadata.creationTimestamp")  # fmt: skip
    return ResourceSpec(
        plural=names["plural"], singular=names.get("singular") or names["kind"].lower(),
        kind=names["kind"], namespaced=spec.get("scope") == "Namespaced", verbs=verbs,
        schema=served["schema"]["openAPIV3Schema"], short=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()), columns=columns,
        field_paths=field_paths, subresources=subresources,
    )  # fmt: skip


class Provider(Protocol):
    """What backs one resource. Objects carry ``apiVersion``, ``kind`` and ``metadata.name``
    (and ``namespace`` when namespaced). ``metadata.resourceVersion``: give the store's own
    integer versions when it has them (etcd revisions through an informer, a bus key's
    revision): every replica of the worker then serves the same versions, so a write, a
    continue token or a watch resumed on another replica means the same; without them the
    core counts per process (another replica answers 410/409 and clients list again). Hand
    out new dicts for changed objects, never mutate one handed out. Failures are raised as
    ``ApiFailure``."""

    async def objects(self) -> list[dict[str, Any]]:
        """Every object now (cheap: from memory, or one bounded read)."""
        ...

    def changes(self) -> AbstractAsyncContextManager[AsyncIterator[object]]:
        """While inside: an iterator that yields after each change (a watch syncs then)."""
        ...

    async def write(
        self, old: dict[str, Any] | None, new: dict[str, Any], user: str
    ) -> Sequence[str]:
        """Store ``new`` (``old`` None: create); the core has checked versions and identity
        already. :returns: warnings for the client (``Warning`` headers)."""
        ...

    async def delete(self, obj: dict[str, Any], user: str) -> None:
        """Delete ``obj``."""
        ...

    async def subresource(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        """GET of ``<resource>/<name>/<subresource>``."""
        ...


@runtime_checkable
class Versioned(Protocol):
    """A provider whose store has a collection version too (an informer: the last
    resourceVersion it saw, deletions included). Optional: with it a deletion takes the
    store's version, as every replica sees it; without, the next count."""

    def version(self) -> int | None: ...


class GroupVersion(msgspec.Struct, frozen=True, kw_only=True):
    group: str
    version: str
    resources: tuple[ResourceSpec, ...]

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}"

    def resource(self, plural: str) -> ResourceSpec | None:
        return next((r for r in self.resources if r.plural == plural), None)

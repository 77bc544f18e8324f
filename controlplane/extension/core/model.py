"""What the core serves, declared as data: a group version and its resources.

:class:`ResourceSpec` is everything the core needs to serve a resource besides its objects:
names (plural, singular, kind, short names, categories), scope, verbs, the
``openAPIV3Schema`` (the same typed schema dicts the CRDs are built from, described as
:func:`controlplane.crddocs.describe` does) from which OpenAPI v2/v3, strict field validation,
strategic merge and server-side apply all read; printer columns; extra field-selector paths;
subresources.

:class:`Provider` is what backs a resource (a settings store, an informer's cache, a bus
ledger): the objects now, a way to wait for a change, and the writes. The core does everything
else (versions, selectors, paging, watch, patches, apply, conflicts, tables, OpenAPI).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import msgspec

from controlplane.extension.core.tables import Column

__all__ = ["GroupVersion", "Provider", "ResourceSpec", "Subresource"]

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


class Provider(Protocol):
    """What backs one resource. Objects carry ``apiVersion``, ``kind`` and ``metadata.name``
    (and ``namespace`` when namespaced); ``resourceVersion`` is the core's, any given is
    replaced. Failures are raised as ``ApiFailure``."""

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


class GroupVersion(msgspec.Struct, frozen=True, kw_only=True):
    group: str
    version: str
    resources: tuple[ResourceSpec, ...]

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}"

    def resource(self, plural: str) -> ResourceSpec | None:
        return next((r for r in self.resources if r.plural == plural), None)

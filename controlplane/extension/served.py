"""What backs ``gpustack.ai/v1``'s resources in the API-serving core: one provider each.

- :class:`SettingsProvider`: the settings store (:class:`~controlplane.clustersettings.source.SettingsSource`):
  objects rendered from the stored texts, a change on every swap of the store, writes of
  ``spec.value`` through the catalog's rules (422 naming the rule, 409 when the store moved
  under the write, 503 when it cannot be written). Settings carry no labels or annotations:
  a write adding any is refused (422), except client-side ``kubectl apply``'s
  last-applied-configuration, which is not stored and says so in a ``Warning`` (so that
  ``kubectl apply`` works, recomputing its patch each time).
- :class:`ViewProvider`: a read-only view computed from memory (or, for the fleet aggregate, one
  bounded read of the gateway's socket); writes are 405 (the core never calls them, the verbs
  are not declared).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from controlplane import errors
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.clustersettings.catalog import BY_NAME, CATALOG
from controlplane.clustersettings.source import SettingsSource
from controlplane.extension import objects
from controlplane.extension.core.failures import ApiFailure, conflict, invalid

__all__ = ["LAST_APPLIED", "SettingsProvider", "ViewProvider"]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _refused(what: str) -> ApiFailure:
    return ApiFailure(405, "MethodNotAllowed", f"{what} is read-only")


class SettingsProvider:
    def __init__(self, source: SettingsSource, namespace: str) -> None:
        self._source, self._namespace = source, namespace

    async def objects(self) -> list[dict[str, Any]]:
        stored = self._source.stored
        return [objects.setting(e, stored.data.get(e.name, e.default), namespace=self._namespace,
                                version=stored.version, created=stored.created)
                for e in CATALOG]  # fmt: skip

    @asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[object]]:
        async with self._source.changes() as changes:
            yield changes

    async def write(
        self, old: dict[str, Any] | None, new: dict[str, Any], user: str
    ) -> Sequence[str]:
        name = new["metadata"]["name"]
        if old is None or name not in BY_NAME:
            raise ApiFailure(405, "MethodNotAllowed", "settings cannot be created: the catalog "
                             "is fixed")  # fmt: skip
        meta = new.get("metadata") or {}
        notes = dict(meta.get("annotations") or {})
        dropped = notes.pop(LAST_APPLIED, None) is not None
        if meta.get("labels") or notes:
            raise invalid(objects.GROUP, "Setting", name, [
                ("metadata", "settings carry no labels or annotations")])  # fmt: skip
        value = (new.get("spec") or {}).get("value")
        if not isinstance(value, str):
            raise invalid(objects.GROUP, "Setting", name,
                          [("spec.value", "Required value: a string")])  # fmt: skip
        try:
            await self._source.write(name, value)
        except settingscatalog.InvalidSetting as e:
            raise invalid(objects.GROUP, "Setting", name, [("spec.value", str(e))]) from e
        except errors.Conflict as e:
            raise conflict(objects.GROUP, "settings", name, f"{e}; read it again") from e
        except errors.ApiError as e:
            raise ApiFailure(503, "ServiceUnavailable", f"cannot store the setting: {e}") from e
        entry = BY_NAME[name]
        warnings = [f"{entry.name}: {settingscatalog.INERT_NOTE}"] if entry.inert else []
        if dropped:
            warnings.append(f"{entry.name}: settings keep no annotations; {LAST_APPLIED} was "
                            "not stored (prefer kubectl apply --server-side)")  # fmt: skip
        return warnings

    async def delete(self, obj: dict[str, Any], user: str) -> None:
        raise _refused("settings")

    async def subresource(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        raise _refused("settings")


class ViewProvider:
    """A read-only view: ``read`` gives its objects (raising ApiFailure when it cannot)."""

    def __init__(self, name: str, read: Callable[[], Awaitable[list[dict[str, Any]]]]) -> None:
        self._name, self._read = name, read

    async def objects(self) -> list[dict[str, Any]]:
        return await self._read()

    @asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[object]]:
        async def never() -> AsyncIterator[object]:
            await anyio.sleep_forever()
            yield None  # pragma: no cover

        yield never()

    async def write(
        self, old: dict[str, Any] | None, new: dict[str, Any], user: str
    ) -> Sequence[str]:
        raise _refused(self._name)

    async def delete(self, obj: dict[str, Any], user: str) -> None:
        raise _refused(self._name)

    async def subresource(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        raise _refused(self._name)

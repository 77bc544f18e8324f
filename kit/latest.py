"""The latest decision per key, replaced whole by its one producer and read by its consumers.

Two loops of the worker decide a value per key that another part reads on demand: the
ModelStoreBinding meter decides each namespace's quotas (read by the artifact reconciler into
its records), the ModelPrefetch reconciler each node's pins (read into the node's NodeModelStore
spec). The reader is built before the producer (the producer's ``on_...`` listener is the
reader), so the value lives in a :class:`Latest` made first and given to both at construction:
the producer :meth:`~Latest.replace`\\ s it, the readers hold only its :meth:`~Latest.get`.

Invariant: :meth:`Latest.get` of a key the last :meth:`Latest.replace` did not name is the
default; :meth:`Latest.replace` answers exactly the keys whose value differs (added, changed
or gone), sorted, so the producer tells its listener each of them once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

__all__ = ["Latest"]

K = TypeVar("K", bound=str)
V = TypeVar("V")


class Latest(Generic[K, V]):
    """Key -> the value last decided for it (the default when none was)."""

    def __init__(self, default: V) -> None:
        self._default = default
        self._values: dict[K, V] = {}

    def get(self, key: K) -> V:
        return self._values.get(key, self._default)

    def replace(self, fresh: Mapping[K, V]) -> list[K]:
        """Hold ``fresh`` from now on; answer the keys whose value changed, sorted."""
        old = self._values
        changed = sorted(k for k in fresh.keys() | old.keys() if fresh.get(k) != old.get(k))
        self._values = dict(fresh)
        return changed

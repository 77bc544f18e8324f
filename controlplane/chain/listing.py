"""What the chain reconciler last listed: its few kinds, and Kueue's only while Kueue is there.

The reconciler plans against a cache of the objects it depends on (Namespaces, InstanceTypes,
their flavor catalog, the Kueue kinds), listed again every ``period_s`` and dropped after an API
error; between lists the writes of :mod:`~controlplane.chain.converging` keep it current.
:class:`Listed` holds that cache and decides when it is due, so the reconciler is its loop and
the state between passes.

Kueue's CRDs may be absent (404 on a collection): then its kinds are left out of the cache and
listed again only after :class:`~controlplane.chain.deciding.KueueWait`'s backoff, logged at
each try; the other kinds go on. Between those tries the Kueue kinds last listed are kept.
Invariants: a cache, once listed, always holds the three chain kinds; it holds the Kueue kinds
exactly while :attr:`Listed.kueue_present`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controlplane import errors
from controlplane.chain import deciding, naming
from controlplane.chain.deciding import Cache, KueueWait
from controlplane.chain.settings import ChainSettings
from controlplane.k8s.client import KubeClient
from controlplane.resources import Resource

__all__ = ["Listed"]

log = logging.getLogger(__name__)

CHAIN_KINDS: tuple[Resource, ...] = (
    naming.NAMESPACES,
    naming.INSTANCETYPES,
    naming.INSTANCETYPEFLAVORS,
)


class Listed:
    """The cache of the chain's objects, when it was listed, and the wait for Kueue."""

    def __init__(self, api: KubeClient, settings: ChainSettings, clock: Callable[[], float]):
        self._api = api
        self._clock = clock
        self._at = float("-inf")
        self._kueue = KueueWait.of(settings)
        self.cache: Cache | None = None
        """None until the first list and after :meth:`drop`."""

    @property
    def kueue_present(self) -> bool:
        """Kueue's CRDs answered the last list of them."""
        return self._kueue.present

    def due(self, now: float, period_s: float) -> bool:
        """Whether a pass at ``now`` lists first (nothing held, or held ``period_s`` already)."""
        return self.cache is None or now - self._at >= period_s

    def drop(self) -> None:
        """Forget the cache (an API error: the next pass lists everything again)."""
        self.cache = None

    async def refresh(self, settings: ChainSettings) -> Cache:
        """List the chain's kinds, and Kueue's when managed and due (else keep the last)."""
        cache: Cache = {}
        for resource in CHAIN_KINDS:
            cache[resource] = {
                deciding.ref_of(resource, b): b for b in await self._api.list(resource)
            }
        if settings.manage_kueue and self._kueue.due(self._clock()):
            await self._list_kueue(cache)
        elif self._kueue.present and self.cache is not None:
            for resource in naming.KUEUE_KINDS:
                cache[resource] = self.cache.get(resource, {})
        self.cache = cache
        self._at = self._clock()
        return cache

    async def _list_kueue(self, cache: Cache) -> None:
        try:
            for resource in naming.KUEUE_KINDS:
                cache[resource] = {
                    deciding.ref_of(resource, b): b for b in await self._api.list(resource)
                }
        except errors.NotFound:
            wait = self._kueue.missed(self._clock())
            log.warning(
                "Kueue's CRDs (%s/%s) are not installed: the Kueue objects wait; trying "
                "again in %.0fs", naming.KUEUE_GROUP, naming.KUEUE_VERSION, wait,
            )  # fmt: skip
            for resource in naming.KUEUE_KINDS:
                cache.pop(resource, None)
            return
        if self._kueue.found():
            log.info("Kueue's CRDs are installed: managing the Kueue objects")

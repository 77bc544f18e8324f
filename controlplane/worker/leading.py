"""Leader election on a ``coordination.k8s.io/v1`` Lease: one active replica, the rest follow.

:func:`decide` is the pure rule; :func:`run_elected` the loop. A replica acquires the Lease when
it is absent, expired (``renewTime + leaseDurationSeconds`` in the past) or released (no holder),
with a ``resourceVersion`` precondition so two candidates never both win. The leader renews every
``retry_s``; when it cannot renew for ``renew_timeout_s`` it stops leading *before* the lease can
expire for others (``renew_timeout_s < lease_s``), so two leaders never overlap. On a clean exit
the leader releases the Lease, so a successor takes over at once instead of after ``lease_s``;
so does a replica cancelled while its acquiring request was in flight.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import anyio
import msgspec

from controlplane import errors
from controlplane.k8s.client import KubeClient
from controlplane.resources import LEASES, Ref

__all__ = ["LeaderSettings", "decide", "run_elected"]

log = logging.getLogger(__name__)

Decision = Literal["create", "renew", "take", "follow"]


class LeaderSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The election's Lease: every field from a flag (``--kube-leader-*``, ``--namespace``),
    whose default is the command table's, so none is repeated here."""

    name: str
    namespace: str
    lease_s: float
    renew_timeout_s: float

    @property
    def retry_s(self) -> float:
        return max(0.05, self.renew_timeout_s / 4)


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decide(lease: dict[str, Any] | None, me: str, now: datetime) -> Decision:
    """What ``me`` should do about the Lease as read at ``now`` (pure)."""
    if lease is None:
        return "create"
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if holder == me:
        return "renew"
    renewed = _time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if not holder or renewed is None or renewed + timedelta(seconds=duration) < now:
        return "take"
    return "follow"


class _Elector:
    def __init__(self, client: KubeClient, settings: LeaderSettings, identity: str) -> None:
        self._client = client
        self._settings = settings
        self._me = identity
        self._ref = Ref(resource=LEASES, name=settings.name, namespace=settings.namespace)

    async def try_acquire(self) -> bool:
        """One attempt to become (or stay) leader; True when this replica holds the Lease."""
        now = datetime.now(UTC)
        try:
            lease: dict[str, Any] | None = await self._client.get(self._ref)
        except errors.NotFound:
            lease = None
        decision = decide(lease, self._me, now)
        if decision == "follow":
            return False
        spec = dict((lease or {}).get("spec") or {})
        if decision != "renew":
            spec["acquireTime"] = _stamp(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
        spec.update(
            holderIdentity=self._me,
            leaseDurationSeconds=max(1, round(self._settings.lease_s)),
            renewTime=_stamp(now),
        )
        try:
            if lease is None:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self._ref.name, "namespace": self._ref.namespace},
                        "spec": spec}  # fmt: skip
                await self._client.create(self._ref, body)
            else:
                rv = lease["metadata"]["resourceVersion"]
                await self._client.patch(
                    self._ref, {"metadata": {"resourceVersion": rv}, "spec": spec}
                )
        except errors.Conflict:
            return False
        return True

    async def release(self) -> None:
        try:
            lease = await self._client.get(self._ref)
            if (lease.get("spec") or {}).get("holderIdentity") == self._me:
                rv = lease["metadata"]["resourceVersion"]
                body = {"metadata": {"resourceVersion": rv}, "spec": {"holderIdentity": None}}
                await self._client.patch(self._ref, body)
        except errors.ApiError as e:
            log.info("could not release the lease: %s", e)


async def _keep(elector: _Elector, settings: LeaderSettings, stop: anyio.CancelScope) -> None:
    last = time.monotonic()
    while True:
        await anyio.sleep(settings.retry_s)
        try:
            held = await elector.try_acquire()
        except errors.ApiError as e:
            log.warning("renewing the lease failed: %s", e)
            held = None
        if held:
            last = time.monotonic()
        elif held is False or time.monotonic() - last > settings.renew_timeout_s:
            log.warning("lost the lease; stepping down")
            stop.cancel()
            return


async def run_elected(
    client: KubeClient,
    settings: LeaderSettings,
    identity: str,
    lead: Callable[[], Awaitable[None]],
    *,
    on_change: Callable[[bool], None] = lambda leading: None,
) -> None:
    """Forever: wait to win the Lease, run ``lead()`` while holding it, cancel it on loss.

    On any exit (cancellation included, even in the middle of the acquiring request) the Lease
    is released when this replica holds it, so a successor takes over at once. Only when the
    API cannot be reached within ``renew_timeout_s`` during that release is the Lease left to
    expire after ``lease_s``.
    """
    elector = _Elector(client, settings, identity)
    try:
        while True:
            await _wait_to_win(elector, settings)
            log.info("%s became the leader (lease %s)", identity, settings.name)
            on_change(True)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_keep, elector, settings, tg.cancel_scope)
                    await lead()
                    tg.cancel_scope.cancel()
            finally:
                on_change(False)
                with anyio.move_on_after(settings.renew_timeout_s, shield=True):
                    await elector.release()
    finally:
        with anyio.move_on_after(settings.renew_timeout_s, shield=True):
            await elector.release()


async def _wait_to_win(elector: _Elector, settings: LeaderSettings) -> None:
    while True:
        try:
            if await elector.try_acquire():
                return
        except errors.ApiError as e:
            log.warning("acquiring the lease failed: %s", e)
        await anyio.sleep(settings.retry_s)

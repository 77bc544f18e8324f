"""Creating and reclaiming MIG instances for ``<base>.partitioned`` allocations.

Three layers. :class:`NvmlMig` is the blocking NVML side (one NVML session per call; run it in a
worker thread). :class:`Record` files are the ownership markers: one JSON file per allocation
under ``<host work dir>/partitions/``, written (atomically) before Allocate answers and removed
after the instance is destroyed, so a restarted agent knows which instance belongs to which
allocation and adopts it instead of reclaiming it. :class:`Partitions` is the async layer: NVML
calls go through ``anyio.to_thread`` under a per-card lock, so a create and a destroy on one card
never interleave; decisions are :mod:`partitions`' pure functions.

Invariants:

- a placement being created is reserved in-process until its record exists, so two concurrent
  Allocates never pick the same slices;
- creation is shielded from cancellation from the NVML call to the record write: an instance
  exists only with its record (or is rolled back), never half-owned;
- an instance is destroyed CI first, then GI; ``IN_USE`` is retried ``destroy_attempts`` times,
  then left for the next reclaim tick.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import anyio.to_thread
import msgspec

from agent.deviceplugin import errors, partitions
from agent.deviceplugin.resources import Card
from agent.devices.libs import nvml

log = logging.getLogger(__name__)


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """Which MIG instance one allocation owns (the on-disk ownership marker)."""

    allocation_id: str
    resource: str
    device_ids: tuple[str, ...]
    card_id: str
    gpu_instance_id: int
    compute_instance_id: int
    mig_uuid: str
    profile_id: int
    profile_name: str
    start: int
    size: int


@dataclass(frozen=True)
class CardSurvey:
    """One card as NVML shows it now."""

    mig_enabled: bool
    profiles: tuple[nvml.GpuInstanceProfile, ...] = ()
    instances: tuple[tuple[partitions.Instance, partitions.Occupied], ...] = ()


@dataclass(frozen=True)
class Created:
    gpu_instance_id: int
    compute_instance_id: int
    mig_uuid: str


class MigControl(Protocol):
    """The blocking MIG operations (a worker thread calls them)."""

    def survey(self, card_ids: Sequence[str]) -> dict[str, CardSurvey]: ...

    def create(self, card_id: str, profile: nvml.GpuInstanceProfile, start: int) -> Created: ...

    def destroy(self, card_id: str, gpu_instance_id: int) -> None: ...


class NvmlMig:
    """:class:`MigControl` over the NVML adapter (the real library or the simulator)."""

    def __init__(self, adapter: nvml.Nvml) -> None:
        self.nvml = adapter

    def survey(self, card_ids: Sequence[str]) -> dict[str, CardSurvey]:
        """Every card that answered; a card that failed is left out (not placed, not reclaimed)."""
        found: dict[str, CardSurvey] = {}
        with self.nvml.session():
            for card_id in card_ids:
                try:
                    found[card_id] = self._survey(card_id)
                except nvml.NvmlError as e:
                    log.warning("MIG survey of card %s failed: %s", card_id, e)
        return found

    def _survey(self, card_id: str) -> CardSurvey:
        h = self.nvml.handle_by_uuid(card_id)
        if not self.nvml.mig_mode(h):
            return CardSurvey(mig_enabled=False)
        profiles = self.nvml.gpu_instance_profiles(h)
        uuids: dict[int, list[str]] = {}
        for mig in self.nvml.mig_devices(h):
            uuids.setdefault(mig.gpu_instance_id, []).append(mig.uuid)
        instances = []
        for p in profiles:
            for gi in self.nvml.gpu_instances(h, p.index, p.instance_count):
                instance = partitions.Instance(card_id, gi.id, tuple(uuids.get(gi.id, ())))
                occupied = partitions.Occupied(p.index, gi.start, gi.size, p.slice_count)
                instances.append((instance, occupied))
        return CardSurvey(mig_enabled=True, profiles=profiles, instances=tuple(instances))

    def create(self, card_id: str, profile: nvml.GpuInstanceProfile, start: int) -> Created:
        """A GI at ``start`` with one CI spanning it; a failure after the GI rolls it back."""
        with self.nvml.session():
            h = self.nvml.handle_by_uuid(card_id)
            size = next(z for s, z in profile.placements if s == start)
            gi = self.nvml.create_gpu_instance(h, profile.index, start, size)
            try:
                ci = self.nvml.create_compute_instance(gi.handle, profile.slice_count)
                try:
                    mig = next(
                        m
                        for m in self.nvml.mig_devices(h)
                        if (m.gpu_instance_id, m.compute_instance_id) == (gi.id, ci.id)
                    )
                except StopIteration:
                    self.nvml.destroy_compute_instance(ci.handle)
                    raise nvml.NvmlCallFailed(
                        "nvmlDeviceGetMigDeviceHandleByIndex", nvml.NOT_FOUND, "new MIG device"
                    ) from None
            except BaseException:
                with contextlib.suppress(nvml.NvmlError):
                    self.nvml.destroy_gpu_instance(gi.handle)
                raise
            return Created(gi.id, ci.id, mig.uuid)

    def destroy(self, card_id: str, gpu_instance_id: int) -> None:
        """Destroy every CI of the GI, then the GI. A GI already gone is not an error.

        :raises nvml.NvmlInUse: a process still uses it.
        """
        with self.nvml.session():
            h = self.nvml.handle_by_uuid(card_id)
            for p in self.nvml.gpu_instance_profiles(h):
                for gi in self.nvml.gpu_instances(h, p.index, p.instance_count):
                    if gi.id != gpu_instance_id:
                        continue
                    for ci in self.nvml.compute_instances(gi.handle):
                        self.nvml.destroy_compute_instance(ci.handle)
                    self.nvml.destroy_gpu_instance(gi.handle)
                    return


# ------------------------------------------------------------------ ownership records


def records_dir(host_work_dir: str) -> str:
    return os.path.join(host_work_dir, "partitions")


def record_path(host_work_dir: str, allocation_id: str) -> str:
    digest = hashlib.sha256(allocation_id.encode()).hexdigest()[:24]
    return os.path.join(records_dir(host_work_dir), f"{digest}.json")


def load_records(host_work_dir: str) -> dict[str, Record]:
    """Every readable record; a malformed file is logged and skipped, never fatal."""
    found: dict[str, Record] = {}
    directory = records_dir(host_work_dir)
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(directory)):
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(directory, name), "rb") as f:
                    record = msgspec.json.decode(f.read(), type=Record)
            except (OSError, msgspec.DecodeError) as e:
                log.warning("skipping unreadable MIG ownership record %s: %s", name, e)
                continue
            found[record.allocation_id] = record
    return found


def write_record(host_work_dir: str, record: Record) -> None:
    path = record_path(host_work_dir, record.allocation_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as f:
        f.write(msgspec.json.encode(record))
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def remove_record(host_work_dir: str, allocation_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_path(host_work_dir, allocation_id))


# ------------------------------------------------------------------ the async layer


@dataclass
class Partitions:
    """MIG instances of this node's partitioned allocations. Event-loop thread only."""

    control: MigControl
    host_work_dir: str
    destroy_attempts: int = 5
    destroy_backoff_s: float = 0.2
    debounce_s: float = 60.0
    records: dict[str, Record] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    """Allocations the ledger released whose instance still exists: destroyed on the next tick."""
    _reserved: dict[str, tuple[str, partitions.Occupied]] = field(default_factory=dict)
    _busy: set[tuple[str, int]] = field(default_factory=set)
    _locks: dict[str, anyio.Lock] = field(default_factory=dict)
    _unaccounted: dict[tuple[str, int], float] = field(default_factory=dict)
    wake: anyio.Event = field(default_factory=anyio.Event)

    async def load(self) -> None:
        self.records = await anyio.to_thread.run_sync(load_records, self.host_work_dir)

    def lock(self, card_id: str) -> anyio.Lock:
        return self._locks.setdefault(card_id, anyio.Lock())

    def pending(self, allocation_id: str) -> bool:
        return allocation_id in self._reserved

    def note_released(self, allocation_id: str) -> None:
        if allocation_id in self.records:
            self.released.add(allocation_id)
            self.wake.set()

    async def create(
        self,
        allocation_id: str,
        resource: str,
        device_ids: Sequence[str],
        cards: Sequence[Card],
        *,
        profile: str | None = None,
    ) -> Record:
        """Place, create and record one instance of ``profile`` (None: the one
        ``len(device_ids)`` tokens cover).

        :raises errors.Exhausted: no card on this node can host it.
        :raises errors.ActuationFailed: NVML refused for another reason.
        """
        tokens = len(device_ids)
        survey = await anyio.to_thread.run_sync(self.control.survey, [c.id for c in cards])
        choice = partitions.choose(self._states(cards, survey), tokens, profile)
        if choice is None:
            what = f"partition profile {profile}" if profile else f"{tokens} partitioned token(s)"
            raise errors.Exhausted(f"no card on this node can host 1 instance of {what}")
        p = choice.profile
        self._reserved[allocation_id] = (
            choice.card_id,
            partitions.Occupied(p.index, choice.start, choice.size, p.slice_count),
        )
        try:
            with anyio.CancelScope(shield=True):
                async with self.lock(choice.card_id):
                    created = await self._create(choice)
                record = Record(
                    allocation_id=allocation_id,
                    resource=resource,
                    device_ids=tuple(sorted(device_ids)),
                    card_id=choice.card_id,
                    gpu_instance_id=created.gpu_instance_id,
                    compute_instance_id=created.compute_instance_id,
                    mig_uuid=created.mig_uuid,
                    profile_id=p.index,
                    profile_name=p.name,
                    start=choice.start,
                    size=choice.size,
                )
                await anyio.to_thread.run_sync(write_record, self.host_work_dir, record)
                self.records[allocation_id] = record
                self.released.discard(allocation_id)
        finally:
            del self._reserved[allocation_id]
        return record

    async def _create(self, choice: partitions.Choice) -> Created:
        try:
            return await anyio.to_thread.run_sync(
                self.control.create, choice.card_id, choice.profile, choice.start
            )
        except nvml.NvmlNoRoom as e:
            raise errors.Exhausted(
                f"no card on this node can host 1 instance of partition profile "
                f"{choice.profile.name}: {e}"
            ) from e
        except nvml.NvmlError as e:
            raise errors.ActuationFailed(
                f"cannot create a {choice.profile.name} instance on card {choice.card_id}: {e}"
            ) from e

    def _states(
        self, cards: Iterable[Card], survey: dict[str, CardSurvey]
    ) -> list[partitions.CardState]:
        states = []
        for card in cards:
            seen = survey.get(card.id)
            if seen is None:
                continue
            reserved = tuple(o for c, o in self._reserved.values() if c == card.id)
            states.append(
                partitions.CardState(
                    card_id=card.id,
                    index=card.index,
                    mig_enabled=seen.mig_enabled,
                    healthy=not card.unhealthy,
                    token_count=card.partition_count,
                    profiles=seen.profiles,
                    occupied=tuple(o for _, o in seen.instances) + reserved,
                )
            )
        return states

    async def reclaim(self, card_ids: Sequence[str], held: Collection[str], now: float) -> int:
        """One level-based pass: destroy what no held allocation accounts for. Returns how many."""
        self.wake = anyio.Event()
        survey = await anyio.to_thread.run_sync(self.control.survey, list(card_ids))
        found = [i for s in survey.values() for i, _ in s.instances]
        owners = {(r.card_id, r.gpu_instance_id): a for a, r in self.records.items()}
        plan = partitions.plan_reclaim(
            found,
            owners=owners,
            held=held,
            released=self.released,
            busy=self._busy | self._reserved_keys(survey),
            unaccounted_since=self._unaccounted,
            now=now,
            debounce_s=self.debounce_s,
        )
        self._unaccounted = plan.unaccounted_since
        destroyed = 0
        for instance in plan.destroy:
            if await self.destroy(instance):
                destroyed += 1
                owner = owners.get(instance.key)
                if owner is not None:
                    await self._forget(owner)
        present = {i.key for i in found}
        for allocation_id in [a for a in self.released if a in self.records]:
            r = self.records[allocation_id]
            if r.card_id in survey and (r.card_id, r.gpu_instance_id) not in present:
                await self._forget(allocation_id)  # gone already (destroyed by hand)
        return destroyed

    def _reserved_keys(self, survey: dict[str, CardSurvey]) -> set[tuple[str, int]]:
        """Instances sitting on a reserved placement: being created right now, not orphans."""
        keys = set()
        for card_id, occupied in self._reserved.values():
            for instance, o in survey.get(card_id, CardSurvey(False)).instances:
                if (o.start, o.size) == (occupied.start, occupied.size):
                    keys.add(instance.key)
        return keys

    async def _forget(self, allocation_id: str) -> None:
        self.records.pop(allocation_id, None)
        self.released.discard(allocation_id)
        await anyio.to_thread.run_sync(remove_record, self.host_work_dir, allocation_id)

    async def destroy(self, instance: partitions.Instance) -> bool:
        """Destroy CI then GI, retrying IN_USE a bounded number of times; False: still there."""
        self._busy.add(instance.key)
        try:
            for attempt in range(1, self.destroy_attempts + 1):
                try:
                    async with self.lock(instance.card_id):
                        await anyio.to_thread.run_sync(
                            self.control.destroy, instance.card_id, instance.gpu_instance_id
                        )
                    log.info("destroyed MIG instance %s/%d", *instance.key)
                    return True
                except nvml.NvmlInUse:
                    if attempt == self.destroy_attempts:
                        log.warning("MIG instance %s/%d still in use; later", *instance.key)
                        return False
                    await anyio.sleep(self.destroy_backoff_s)
                except nvml.NvmlError as e:
                    log.warning("cannot destroy MIG instance %s/%d: %s", *instance.key, e)
                    return False
            return False
        finally:
            self._busy.discard(instance.key)

"""Accelerator health as a pure state machine: what makes a card Unhealthy, and what brings it back.

The device agent feeds :class:`HealthBook` three kinds of observation, all synchronous and
timestamped by the caller (so tests need no event loop and no clock):

- :meth:`HealthBook.xid`: an NVML XID critical-error event (from :mod:`agent.serve.watching`);
- :meth:`HealthBook.observe`: one monitor pass. A card the pass reports ``unhealthy`` (NVML
  answered ``GPU_IS_LOST``) or does not report at all although it was known is *lost*. That last
  rule is the AMD equivalent of GPU_IS_LOST: the kernel removes the card's
  ``/sys/bus/pci/devices/<bdf>`` directory when it falls off the bus, and a card whose
  ``unique_id`` is unreadable cannot be sampled; either way it vanishes from the pass. A card the
  pass reports normally has *answered*.
- the clock: a card down for a transient reason is re-checked once its quarantine has expired;
  the next pass in which it answers normally brings it back (``RECOVERED``).

XID policy (``XID_POLICY``), from NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors,
"Resolution Bucket (Immediate Action)") and NVIDIA's k8s-device-plugin:

======================  =========  ==========================================================
XID                     verdict    why
======================  =========  ==========================================================
13 31 43 45 68 109      ignored    application faults; NVIDIA's device plugin ignores them too
48                      reset      double-bit ECC error (catalog: RESET_GPU)
63 64                   reset      row-remap / page-retirement pending or failed: effective
                                   only after a GPU reset (RESET_GPU)
74                      reset      NVLink error (RESET_GPU)
79                      reset      GPU has fallen off the bus (RESET_GPU, often a reboot)
92                      reset      high single-bit ECC rate (pre-Ampere catalog: reset)
95                      reset      uncontained ECC error (RESET_GPU)
119 120                 reset      GSP RPC timeout / GSP error (RESET_GPU)
94                      transient  contained ECC error: the catalog says RESTART_APP, so the
                                   card is quarantined, not condemned
anything else           transient  quarantined, then re-checked
======================  =========  ==========================================================

Invariants: a reset-verdict card never returns to Healthy in this process (only a GPU reset,
which restarts the agent's view, clears it); a transition is only reported when healthiness
changes, never as a repeat; a new XID during quarantine restarts the quarantine.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from bus import devices, events


class Verdict(enum.Enum):
    IGNORE = "ignore"
    TRANSIENT = "transient"
    RESET = "reset"


IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
RESET_XIDS = frozenset({48, 63, 64, 74, 79, 92, 95, 119, 120})

_XID_TEXT: Mapping[int, str] = {
    48: "double-bit ECC error",
    63: "row remapping pending",
    64: "row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def classify_xid(xid: int) -> Verdict:
    """What an XID means for the card's health (see the module docstring's table)."""
    if xid in IGNORED_XIDS:
        return Verdict.IGNORE
    if xid in RESET_XIDS:
        return Verdict.RESET
    return Verdict.TRANSIENT


@dataclass(frozen=True)
class Down:
    """Why a card is Unhealthy now."""

    reason: str
    """``XID`` or ``LOST``."""
    message: str
    permanent: bool
    """True when only a GPU reset can fix it: never re-checked."""
    recheck_at: float
    """When the card may next be found healthy (monotonic seconds); ignored when permanent."""
    xid: int | None = None

    def event(self, node: str, accelerator_id: str) -> events.HealthEvent:
        """The health event that says the card is down now, and why (to publish it again)."""
        return events.HealthEvent(
            node=node, accelerator_id=accelerator_id, healthy=False, reason=self.reason,
            xid=self.xid, message=self.message,
        )  # fmt: skip


@dataclass(frozen=True)
class Transition:
    """A change of one card's healthiness, to publish and to push to kubelet."""

    accelerator_id: str
    healthy: bool
    reason: str
    message: str
    xid: int | None = None

    def event(self, node: str) -> events.HealthEvent:
        return events.HealthEvent(
            node=node,
            accelerator_id=self.accelerator_id,
            healthy=self.healthy,
            reason=self.reason,
            xid=self.xid,
            message=self.message,
        )


class HealthBook:
    """The health of every card this process has seen; mutated only by its owner's loop."""

    def __init__(self, *, quarantine_s: float) -> None:
        self.quarantine_s = quarantine_s
        self._down: dict[str, Down] = {}

    def unhealthy(self, accelerator_id: str) -> bool:
        return accelerator_id in self._down

    def down(self, accelerator_id: str) -> Down | None:
        return self._down.get(accelerator_id)

    @property
    def unhealthy_ids(self) -> frozenset[str]:
        """Every card down now (what a republish restates)."""
        return frozenset(self._down)

    def xid(self, accelerator_id: str, xid: int, now: float) -> Transition | None:
        """Record an XID critical error on ``accelerator_id``."""
        verdict = classify_xid(xid)
        if verdict is Verdict.IGNORE:
            return None
        text = _XID_TEXT.get(xid, "XID critical error")
        permanent = verdict is Verdict.RESET
        message = f"XID {xid}: {text}" + ("; GPU reset required" if permanent else "")
        previous = self._down.get(accelerator_id)
        # A card already condemned stays condemned; a transient one may be upgraded.
        permanent = permanent or (previous is not None and previous.permanent)
        self._down[accelerator_id] = Down(
            "XID", message, permanent, now + self.quarantine_s, xid=xid
        )
        if previous is not None:
            return None
        return Transition(accelerator_id, False, "XID", message, xid=xid)

    def lost(self, accelerator_id: str, now: float, message: str) -> Transition | None:
        """Record that the card did not answer (GPU_IS_LOST, or gone from sysfs)."""
        previous = self._down.get(accelerator_id)
        if previous is not None:
            if not previous.permanent and previous.reason == "LOST":
                self._down[accelerator_id] = Down("LOST", message, False, now + self.quarantine_s)
            return None
        self._down[accelerator_id] = Down("LOST", message, False, now + self.quarantine_s)
        return Transition(accelerator_id, False, "LOST", message)

    def answered(self, accelerator_id: str, now: float) -> Transition | None:
        """Record that the card answered NVML (or sysfs) normally."""
        previous = self._down.get(accelerator_id)
        if previous is None or previous.permanent or now < previous.recheck_at:
            return None
        del self._down[accelerator_id]
        message = f"answering normally again after {previous.reason}: {previous.message}"
        return Transition(accelerator_id, True, "RECOVERED", message)

    def observe(
        self,
        expected: Mapping[str, Iterable[str]],
        samples: Sequence[devices.MonitorSample],
        failed: Iterable[str],
        now: float,
    ) -> list[Transition]:
        """Fold one monitor pass in.

        :param expected: manufacturer → ids of the cards known to be there.
        :param failed: manufacturers whose whole pass failed: they tell nothing about any card.
        """
        skip = set(failed)
        reported = {m.manufacturer: m for m in samples}
        out: list[Transition] = []
        for manufacturer in sorted(set(expected) | set(reported)):
            if manufacturer in skip:
                continue
            sample = reported.get(manufacturer)
            seen = {a.id: a for a in sample.accelerators} if sample else {}
            for accelerator_id in sorted(set(expected.get(manufacturer, ())) | set(seen)):
                got = seen.get(accelerator_id)
                if got is None:
                    change = self.lost(accelerator_id, now, "no longer reported by the driver")
                elif got.unhealthy:
                    change = self.lost(accelerator_id, now, "GPU is lost (does not answer)")
                else:
                    change = self.answered(accelerator_id, now)
                if change is not None:
                    out.append(change)
        return out


# -- overlays: the published view ----------------------------------------------------------


def expected_ids(groups: Iterable[devices.DeviceGroup]) -> dict[str, set[str]]:
    """manufacturer → accelerator ids in ``groups``."""
    out: dict[str, set[str]] = {}
    for group in groups:
        out.setdefault(group.manufacturer, set()).update(a.id for a in group.accelerators)
    return out


def overlay(
    book: HealthBook,
    detected: Sequence[devices.DeviceGroup],
    previous: Sequence[devices.DeviceGroup],
) -> list[devices.DeviceGroup]:
    """The groups to publish: ``detected`` with ``status.unhealthy`` from ``book``.

    A card that was published before, is missing from ``detected`` and is Unhealthy in the book
    is kept (Unhealthy) under its old group, so a vanished card is reported, never silently
    dropped while a container may hold it.
    """
    present = {a.id for g in detected for a in g.accelerators}
    groups = {g.id: g for g in detected}
    for old in previous:
        kept = [a for a in old.accelerators if a.id not in present and book.unhealthy(a.id)]
        if not kept:
            continue
        base = groups.get(old.id) or msgspec.structs.replace(old, accelerators=())
        groups[old.id] = msgspec.structs.replace(base, accelerators=(*base.accelerators, *kept))
    marked = [
        msgspec.structs.replace(g, accelerators=tuple(_marked(book, a) for a in g.accelerators))
        for g in groups.values()
    ]
    return devices.canonical_groups(marked)


def _marked(book: HealthBook, accelerator: devices.Accelerator) -> devices.Accelerator:
    unhealthy = book.unhealthy(accelerator.id)
    if accelerator.status.unhealthy == unhealthy:
        return accelerator
    status = msgspec.structs.replace(accelerator.status, unhealthy=unhealthy)
    return msgspec.structs.replace(accelerator, status=status)


def overlay_samples(
    book: HealthBook, samples: Sequence[devices.MonitorSample]
) -> list[devices.MonitorSample]:
    """``samples`` with each accelerator's ``unhealthy`` from ``book``."""
    out = []
    for sample in samples:
        accelerators = tuple(
            a
            if a.unhealthy == book.unhealthy(a.id)
            else msgspec.structs.replace(a, unhealthy=book.unhealthy(a.id))
            for a in sample.accelerators
        )
        out.append(msgspec.structs.replace(sample, accelerators=accelerators))
    return out

"""The units ledger: modes per card, overflow, stale holdings, restore and reconcile."""

from __future__ import annotations

import pytest

from agent.deviceplugin import errors
from agent.deviceplugin import holdings as ledger
from agent.deviceplugin.holdings import Holding, LiveContainer
from agent.deviceplugin.resources import UNITS_PER_CARD, Mode
from bus import events

R = "nvidia.com/gpu"


def _holding(
    ids: tuple[str, ...],
    mode: Mode = "exclusive",
    units: int = UNITS_PER_CARD,
    card: str = "A",
    resource: str = R,
    since: float = 0.0,
) -> Holding:
    return Holding(
        allocation_id=ledger.allocation_id(resource, ids),
        resource=resource,
        mode=mode,
        device_ids=ids,
        charges=((card, units),),
        since=since,
    )


def test_a_card_in_one_mode_refuses_another_naming_both() -> None:
    book = ledger.Ledger()
    book.charge(_holding(("g:A:0000",)))

    with pytest.raises(
        errors.Conflict,
        match=r"card GPU-A .* held in exclusive mode, cannot allocate it in shared mode",
    ):
        book.check("shared", {"A": UNITS_PER_CARD // 10}, {"A": "GPU-A (g #0)"})


def test_units_never_exceed_a_card() -> None:
    book = ledger.Ledger()
    book.charge(_holding(("g:A:0000",), "sliced", UNITS_PER_CARD - 5))

    book.check("sliced", {"A": 5}, {})
    with pytest.raises(errors.Exhausted):
        book.check("sliced", {"A": 6}, {})
    assert book.remaining("A") == 5
    assert book.mode_of("A") == "sliced"


def test_a_reused_device_id_releases_the_stale_holding() -> None:
    book = ledger.Ledger()
    book.charge(_holding(("g:A:0000", "g:B:0000")))

    changes = book.charge(_holding(("g:A:0000",)))

    assert [(c.action, c.holding.device_ids) for c in changes] == [
        ("released", ("g:A:0000", "g:B:0000")),
        ("allocated", ("g:A:0000",)),
    ]
    assert book.mode_of("B") is None or book.used("B") == 0


def _resolve(resource: str, ids: object) -> tuple[Mode, tuple[tuple[str, int], ...]] | None:
    return None if resource != R else ("exclusive", (("A", UNITS_PER_CARD),))


def test_restore_recharges_retained_allocations_and_skips_unknown_ones() -> None:
    book = ledger.Ledger()
    retained = [
        events.AllocationEvent(
            node="n",
            allocation_id="x",
            action="allocated",
            resource=R,
            device_ids=("g:A:0000",),
            pod_name="p",
        ),
        events.AllocationEvent(
            node="n",
            allocation_id="y",
            action="allocated",
            resource="other",
            device_ids=("g:Z:0000",),
        ),
    ]

    changes = book.restore(retained, _resolve, now=5.0)

    assert [c.holding.pod_name for c in changes] == ["p"]
    assert book.mode_of("A") == "exclusive"


def test_reconcile_names_adopts_and_releases_after_the_grace() -> None:
    book = ledger.Ledger()
    book.charge(_holding(("g:A:0000",), since=0.0))
    book.charge(_holding(("g:B:0000",), card="B", since=0.0))
    live = [LiveContainer("ns", "pod", "main", R, ("g:A:0000",))]

    early = book.reconcile(live, _resolve, now=1.0, grace_s=10.0)
    late = book.reconcile(live, _resolve, now=11.0, grace_s=10.0)

    assert [(c.action, c.holding.container) for c in early] == [("allocated", "main")]
    assert [(c.action, c.holding.device_ids) for c in late] == [("released", ("g:B:0000",))]
    event = early[0].event("node-1")
    assert (event.node, event.pod_namespace, event.pod_name) == ("node-1", "ns", "pod")


def test_reconcile_adopts_a_live_allocation_the_ledger_lacks() -> None:
    book = ledger.Ledger()
    live = [LiveContainer("ns", "pod", "main", R, ("g:A:0000",))]

    changes = book.reconcile(live, _resolve, now=0.0, grace_s=10.0)

    assert [c.action for c in changes] == ["allocated"]
    assert book.used("A") == UNITS_PER_CARD


def test_copy_is_a_snapshot() -> None:
    book = ledger.Ledger()
    snapshot = book.copy()
    book.charge(_holding(("g:A:0000",)))

    assert snapshot.holdings() == ()
    assert len(book.holdings()) == 1

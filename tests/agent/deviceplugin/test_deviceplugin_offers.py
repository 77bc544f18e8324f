"""The offer side on its own (:class:`offers.Offers`): what a refresh rebuilds, what it reuses by
identity, what a held card keeps, and where a recorded MIG instance is charged. No ledger, no
event loop: the held modes are handed in as the node would."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.deviceplugin import allocation
from agent.deviceplugin.injection import Injection
from agent.deviceplugin.offers import Offers
from agent.deviceplugin.partitioning import Record
from agent.deviceplugin.server import Key
from agent.deviceplugin.settings import DevicePluginSettings
from bus import devices

EXCLUSIVE: Key = ("nvidia", "exclusive")
SHARED: Key = ("nvidia", "shared")
PARTITIONED = "nvidia.com/gpu.partitioned"


class _NoDecisions:
    """The allocator the servicers are given: the offer side itself never asks it anything."""

    def allocate(self, key: Key, device_ids: Sequence[str]) -> Injection:
        raise AssertionError("the offer side decided an Allocate")

    async def ask_kubelet_first(self) -> None:
        raise AssertionError("the offer side asked kubelet")

    async def allocate_partitioned(self, key: Key, device_ids: Sequence[str]) -> Injection:
        raise AssertionError("the offer side decided a partitioned Allocate")

    def prefer(
        self, key: Key, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        raise AssertionError("the offer side answered GetPreferredAllocation")


def _offers(tmp_path: Path, recorded: Record | None = None) -> Offers:
    settings = DevicePluginSettings.for_tests(str(tmp_path))
    return Offers(settings, _NoDecisions(), recorded=lambda resource, ids: recorded)


def _views(offers: Offers) -> dict[Key, allocation.View]:
    return {key: offers.view(key) for key in offers.servicers}


def test_a_refresh_with_the_same_cards_and_modes_rebuilds_nothing(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    offers = _offers(tmp_path)
    offers.adopt(h200, {})
    views, servicers = _views(offers), dict(offers.servicers)

    offers.refresh({})
    offers.adopt(h200, {})  # the same detection pass again

    assert all(offers.view(key) is view for key, view in views.items())
    assert all(offers.servicers[key] is s for key, s in servicers.items())


def test_a_held_mode_rekeys_only_the_lists_it_changes_and_keeps_every_servicer(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    offers = _offers(tmp_path)
    offers.adopt(h200, {})
    table, servicers, before = offers.servicers, dict(offers.servicers), _views(offers)
    card = h200[0].accelerators[2].id

    offers.refresh({card: "sliced"})
    after = _views(offers)

    rekeyed = {key for key in before if after[key].tokens is not before[key].tokens}
    assert rekeyed == {EXCLUSIVE, SHARED}  # the other three id indexes are the same objects
    assert offers.servicers is table
    assert all(offers.servicers[key] is s for key, s in servicers.items())
    on_card = [t for t in after[EXCLUSIVE].tokens.values() if t.card == card]
    assert on_card and not any(t.healthy for t in on_card)
    assert all(t.healthy for t in before[EXCLUSIVE].tokens.values())


def test_a_held_card_keeps_its_tokens_and_servers_planned_no_more_leave(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    offers = _offers(tmp_path)
    offers.adopt(h200, {})
    table = offers.servicers
    card = h200[0].accelerators[5].id

    offers.adopt([], {card: "exclusive"})  # detection lost every card, one is held

    assert list(offers.cards) == [card]
    assert {t.card for t in offers.view(EXCLUSIVE).tokens.values()} == {card}

    offers.adopt([], {})  # released too: nothing is offered, in the same table
    assert offers.servicers is table and table == {}
    assert not offers.serves("nvidia.com/gpu")
    with pytest.raises(KeyError):
        offers.view(EXCLUSIVE)


def test_a_recorded_instance_is_charged_on_its_own_card_not_the_tokens_card(
    tmp_path: Path, h100_mig: list[devices.DeviceGroup]
) -> None:
    plain = _offers(tmp_path)
    plain.adopt(h100_mig, {})
    token = min(plain.view(("nvidia", "partitioned")).tokens.values(), key=lambda t: t.id)
    elsewhere = next(c for c in plain.partitioned_cards() if c != token.card)
    record = Record(
        allocation_id="a", resource=PARTITIONED, device_ids=(token.id,), card_id=elsewhere,
        gpu_instance_id=1, compute_instance_id=0, mig_uuid="MIG-x", profile_id=19,
        profile_name="1g.10gb", start=0, size=1,
    )  # fmt: skip
    recorded = _offers(tmp_path, record)
    recorded.adopt(h100_mig, {})

    unrecorded = plain.resolve(PARTITIONED, [token.id])
    charged = recorded.resolve(PARTITIONED, [token.id])

    assert unrecorded is not None and charged is not None
    assert unrecorded[0] == charged[0] == "partitioned"
    assert [c for c, _ in unrecorded[1]] == [token.card]
    assert [c for c, _ in charged[1]] == [elsewhere]
    assert recorded.resolve("nvidia.com/gpu.nothing", [token.id]) is None


def test_partitioned_cards_are_the_cards_with_mig_partitions(
    tmp_path: Path, h100_mig: list[devices.DeviceGroup], h200: list[devices.DeviceGroup]
) -> None:
    mig, whole = _offers(tmp_path), _offers(tmp_path)
    mig.adopt(h100_mig, {})
    whole.adopt(h200, {})

    assert mig.partitioned_cards() == [a.id for a in h100_mig[0].accelerators[:4]]  # MIG on 0-3
    assert whole.partitioned_cards() == []

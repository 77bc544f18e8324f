"""Pure MIG decisions: profile choice, packing placement, reclaim planning."""

from __future__ import annotations

from agent.deviceplugin import partitions
from agent.deviceplugin.partitions import CardState, Instance, Occupied
from agent.devices.libs.nvml import GpuInstanceProfile


def _p(
    index: int, name: str, compute: int, starts: list[int], size: int, count: int
) -> GpuInstanceProfile:
    return GpuInstanceProfile(
        index=index, name=name, memory_mib=10_000 * size, slice_count=compute,
        instance_count=count, multiprocessor_count=16 * compute,
        placements=tuple((s, size) for s in starts),
    )  # fmt: skip


H100 = (
    _p(0, "1g.10gb", 1, [0, 1, 2, 3, 4, 5, 6], 1, 7),
    _p(1, "2g.20gb", 2, [0, 2, 4], 2, 3),
    _p(2, "3g.40gb", 3, [0, 4], 4, 2),
    _p(3, "4g.40gb", 4, [0], 4, 1),
    _p(4, "7g.80gb", 7, [0], 8, 1),
    _p(7, "1g.10gb+me", 1, [0, 1, 2, 3, 4, 5, 6], 1, 1),
    _p(9, "1g.20gb", 1, [0, 2, 4, 6], 2, 4),
)


def _card(index: int, *occupied: Occupied, mig: bool = True, healthy: bool = True) -> CardState:
    return CardState(f"GPU-{index}", index, mig, healthy, 7, H100, tuple(occupied))


def test_tokens_map_to_the_smallest_covering_profile() -> None:
    names = [getattr(partitions.profile_for(_card(0), k), "name", None) for k in range(9)]
    assert names == [None, "1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb"] + ["7g.80gb"] * 3 + [None]


def test_packs_the_most_occupied_card_first_fit() -> None:
    one = Occupied(0, 0, 1, 1)
    choice = partitions.choose([_card(0), _card(1, one), _card(2)], 1)
    assert choice is not None
    assert (choice.card_id, choice.profile.name, choice.start) == ("GPU-1", "1g.10gb", 1)


def test_a_full_card_moves_on_and_mig_off_is_never_chosen() -> None:
    full = Occupied(4, 0, 8, 7)
    choice = partitions.choose([_card(0, full), _card(1, mig=False), _card(2)], 3)
    assert choice is not None and (choice.card_id, choice.start) == ("GPU-2", 0)
    assert partitions.choose([_card(0, full), _card(1, mig=False)], 1) is None
    assert partitions.choose([_card(0, healthy=False)], 1) is None


def test_placement_respects_overlap_instance_count_and_compute() -> None:
    three = Occupied(2, 4, 4, 3)
    assert partitions.first_fit(_card(0, three), H100[3]) == (0, 4)  # 4g at 0-3
    assert partitions.first_fit(_card(0, Occupied(3, 0, 4, 4), three), H100[0]) is None
    two = Occupied(1, 0, 2, 2)
    assert partitions.first_fit(_card(0, two, Occupied(1, 2, 2, 2)), H100[1]) == (4, 2)


def test_reclaim_plan() -> None:
    owned, released, orphan, new = (
        Instance("GPU-0", 1), Instance("GPU-0", 2), Instance("GPU-0", 3), Instance("GPU-1", 1),
    )  # fmt: skip
    plan = partitions.plan_reclaim(
        [owned, released, orphan, new],
        owners={owned.key: "a", released.key: "b"},
        held={"a"},
        released={"b"},
        busy=set(),
        unaccounted_since={orphan.key: 0.0},
        now=10.0,
        debounce_s=5.0,
    )
    assert plan.destroy == (released, orphan)
    assert plan.unaccounted_since == {new.key: 10.0}
    busy = partitions.plan_reclaim(
        [orphan], owners={}, held=set(), released=set(), busy={orphan.key},
        unaccounted_since={}, now=0.0, debounce_s=0.0,
    )  # fmt: skip
    assert busy.destroy == ()
